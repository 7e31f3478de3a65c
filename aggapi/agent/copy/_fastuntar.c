/* The agent's per-file loop of a tar upload, compiled (issue 35, item 6).
 *
 * aggapi.agent.copy.fastuntar calls run() at an entry boundary of an upload's tar that
 * is being built in a private tree (tarextract's "fresh" target), with the directory
 * the previous file went into open (TarExtractor._parent: resolved by openat2 under
 * the target, RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, by the Python path). It applies
 * every following entry that is a plain regular file in that same directory, whole
 * within the piece, and stops (returns its position) at the first entry it does not
 * take; the Python path (untar.TarSink, tarextract.TarExtractor), the reference for
 * every case, then applies that one. It takes a strict subset and decides nothing:
 *
 *   - an optional PAX "x" header with only the records path, mtime and AGGAPI.sha256,
 *     each once, in the canonical "%d key=value\n" form;
 *   - a ustar header ("ustar\0", no prefix, zero device fields) of typeflag '0' whose
 *     numeric fields are zero-padded octal (parse._STD_FIELDS), checksum right;
 *   - a name that is the open directory's path, '/', and one more component that
 *     fsroot.check_name accepts (not "", ".", "..", no '/', no NUL, <= 255 bytes), no
 *     "GNUSparseFile."; the caller checked the depth and the other limits;
 *   - a size under the size limit and under WRITEBACK_STEP (the caller's bound);
 *   - the digest record as entrydigest.EntryDigests requires it (a missing or
 *     malformed one is the Python path's to refuse).
 *
 * A name is never resolved here: the file is created with openat(O_CREAT|O_EXCL|
 * O_NOFOLLOW) of one checked component in the already-confined directory fd, so
 * nothing outside it can be reached; an existing name (EEXIST) or any open error
 * stops the run before the entry changes any state. Then, as AtomicFile and
 * TarExtractor.end_file do: write, sha256 (the caller's hashlib), the sha256 check,
 * fchown, fchmod, futimens, fstat, close; pending[rel], files[rel] and sync_fds as
 * there. A sha256 mismatch or an errno after the create is returned with the state as
 * the Python path leaves it, so the caller raises the identical error.
 * run() returns (pos, taken, mismatch, errno).
 */
#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../tar/_ustar.h"

/* One taken entry's Python state: pending[rel] = Pending(parent, leaf, leaf, True). */
static PyObject *note_pending(PyObject *pending, PyObject *factory, PyObject *parent,
                              PyObject *leaf, PyObject *rel)
{
    PyObject *p = PyObject_CallFunctionObjArgs(factory, parent, leaf, leaf, Py_True, NULL);
    if (p == NULL)
        return NULL;
    int bad = PyDict_SetItem(pending, rel, p);
    Py_DECREF(p);
    return bad ? NULL : Py_None;
}

static PyObject *run(PyObject *self, PyObject *args)
{
    Py_buffer data, prefix;
    Py_ssize_t pos, max_take, size_limit, small, max_meta, max_records;
    int pfd, required;
    unsigned int uid, gid;
    PyObject *parent, *skip, *pending, *factory, *files, *sync_fds, *sha256;
    if (!PyArg_ParseTuple(args, "y*ny*iUpOnnnnnIIO!OO!O!O", &data, &pos, &prefix, &pfd,
                          &parent, &required, &skip, &max_take, &size_limit, &small,
                          &max_meta, &max_records, &uid, &gid, &PyDict_Type, &pending,
                          &factory, &PyDict_Type, &files, &PyDict_Type, &sync_fds, &sha256))
        return NULL;
    const unsigned char *d = data.buf;
    Py_ssize_t end = data.len, taken = 0;
    int err = 0;
    PyObject *mismatch = NULL, *result = NULL;

    while (taken < max_take) {
        if (pos < 0 || end - pos < BLOCK)
            break;
        Py_ssize_t at = pos;
        const unsigned char *b = d + at;
        unsigned long long mode, size, mtime;
        Rec recs[R_COUNT] = {{0}};
        if (std_header(b, &mode, &size, &mtime))
            break;
        if (b[156] == 'x') {
            if (size > (unsigned long long)max_meta)
                break;
            Py_ssize_t meta = (Py_ssize_t)size, span = (meta + BLOCK - 1) / BLOCK * BLOCK;
            if (end - at - BLOCK < span + BLOCK)
                break;
            if (pax_records(b + BLOCK, meta, max_records, recs, 0))
                break;
            at += BLOCK + span;
            b = d + at;
            if (std_header(b, &mode, &size, &mtime))
                break;
        }
        const unsigned char *leaf;
        Py_ssize_t llen;
        if (!plain_leaf(b, recs, &prefix, &leaf, &llen))
            break;
        if (size > (unsigned long long)size_limit || size >= (unsigned long long)small)
            break;
        Py_ssize_t span = (Py_ssize_t)((size + BLOCK - 1) / BLOCK * BLOCK);
        if (end - at - BLOCK < span)
            break; /* not whole in this piece */
        if (llen > 255) /* the copy below, and NAME_MAX */
            break;
        long long mtime_ns = (long long)mtime * NS;
        if (recs[R_MTIME].set && pax_mtime(&recs[R_MTIME], &mtime_ns))
            break;
        /* EntryDigests.expected: a record must be well formed, and is required once the
         * stream announced them. */
        if (recs[R_SHA].set ? !hex64(&recs[R_SHA]) : required)
            break;

        /* Taken from here on: the Python path would create it now. */
        char cleaf[256];
        memcpy(cleaf, leaf, (size_t)llen);
        cleaf[llen] = 0;
        const unsigned char *body = b + BLOCK;
        int fd;
        Py_BEGIN_ALLOW_THREADS
        fd = openat(pfd, cleaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        Py_END_ALLOW_THREADS
        if (fd < 0)
            break; /* an existing name, or an error: the Python path's */
        PyObject *leafname = PyUnicode_DecodeUTF8((const char *)leaf, llen, "surrogateescape");
        PyObject *rel = NULL, *got = NULL, *ident = NULL, *dev = NULL;
        if (leafname == NULL)
            goto entry_fail;
        rel = PyUnicode_GET_LENGTH(parent)
                  ? PyUnicode_FromFormat("%U/%U", parent, leafname)
                  : Py_NewRef(leafname);
        if (rel == NULL || note_pending(pending, factory, parent, leafname, rel) == NULL)
            goto entry_fail;
        taken++;
        pos = at + BLOCK + span;
        Py_ssize_t done = 0;
        Py_BEGIN_ALLOW_THREADS
        while (done < (Py_ssize_t)size) {
            ssize_t w = write(fd, body + done, (size_t)((Py_ssize_t)size - done));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                err = w < 0 ? errno : EIO;
                break;
            }
            done += w;
        }
        Py_END_ALLOW_THREADS
        if (err)
            goto entry_done;
        if (skip != Py_None && recs[R_SHA].set && size > 0) {
            /* HeadersHash.skip: the headers digest leaves a checked file's data out. */
            PyObject *r = PyObject_CallFunction(skip, "nn", (Py_ssize_t)(body - d),
                                                (Py_ssize_t)size);
            if (r == NULL)
                goto entry_fail;
            Py_DECREF(r);
        }
        PyObject *view = PyMemoryView_FromMemory((char *)body, (Py_ssize_t)size, PyBUF_READ);
        PyObject *h = view ? PyObject_CallOneArg(sha256, view) : NULL;
        Py_XDECREF(view);
        got = h ? PyObject_CallMethod(h, "hexdigest", NULL) : NULL;
        Py_XDECREF(h);
        if (got == NULL)
            goto entry_fail;
        if (recs[R_SHA].set) {
            Py_ssize_t glen;
            const char *g = PyUnicode_AsUTF8AndSize(got, &glen);
            if (g == NULL)
                goto entry_fail;
            if (glen != 64 || memcmp(g, recs[R_SHA].p, 64) != 0) {
                mismatch = Py_BuildValue("(OOs#)", rel, got, recs[R_SHA].p, (Py_ssize_t)64);
                if (mismatch == NULL)
                    goto entry_fail;
                goto entry_done;
            }
        }
        struct stat st;
        struct timespec ts[2];
        ts[0].tv_sec = ts[1].tv_sec = (time_t)(mtime_ns / NS);
        ts[0].tv_nsec = ts[1].tv_nsec = (long)(mtime_ns % NS);
        Py_BEGIN_ALLOW_THREADS
        if (fchown(fd, uid, gid) || fchmod(fd, (mode_t)(mode & 01777)) || futimens(fd, ts) ||
            fstat(fd, &st))
            err = errno;
        Py_END_ALLOW_THREADS
        if (err)
            goto entry_done;
        ident = Py_BuildValue("(KK)", (unsigned long long)st.st_dev,
                              (unsigned long long)st.st_ino);
        dev = PyLong_FromUnsignedLongLong((unsigned long long)st.st_dev);
        if (ident == NULL || dev == NULL || PyDict_SetItem(files, rel, ident))
            goto entry_fail;
        int known = PyDict_Contains(sync_fds, dev);
        if (known < 0)
            goto entry_fail;
        if (!known) {
            int dup_fd = fcntl(pfd, F_DUPFD_CLOEXEC, 0);
            PyObject *v = dup_fd >= 0 ? PyLong_FromLong(dup_fd) : NULL;
            if (dup_fd < 0)
                err = errno;
            else if (v == NULL || PyDict_SetItem(sync_fds, dev, v)) {
                Py_XDECREF(v);
                close(dup_fd);
                goto entry_fail;
            }
            Py_XDECREF(v);
        }
    entry_done:
        close(fd);
        Py_DECREF(leafname);
        Py_DECREF(rel);
        Py_XDECREF(got);
        Py_XDECREF(ident);
        Py_XDECREF(dev);
        if (err || mismatch)
            break;
        continue;
    entry_fail:
        close(fd);
        Py_XDECREF(leafname);
        Py_XDECREF(rel);
        Py_XDECREF(got);
        Py_XDECREF(ident);
        Py_XDECREF(dev);
        goto fail;
    }
    result = Py_BuildValue("(nnOi)", pos, taken, mismatch ? mismatch : Py_None, err);
fail:
    Py_XDECREF(mismatch);
    PyBuffer_Release(&data);
    PyBuffer_Release(&prefix);
    return result;
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS, "The plain files from pos on (aggapi.agent.copy.fastuntar)."},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastuntar",
                                    "aggapi.agent.copy.fastuntar's compiled loop.", -1,
                                    methods};
PyMODINIT_FUNC PyInit__fastuntar(void) { return PyModule_Create(&module); }
