/* The ncp client's per-file extraction loop, compiled (issue 35, item 6).
 *
 * aggapi.client.fastpath calls run() at an entry boundary of a directory download's
 * tar, with the directory the previous entry went into already open. It applies every
 * following entry that is a plain regular file in that same directory, whole within
 * the piece, and stops (returns its position) at the first entry it does not take;
 * the Python extractor (aggapi.client.extractor), the reference for every case, then
 * applies that one. An entry taken here must be one the Python path would apply the
 * same way, so this accepts only a strict subset and decides nothing else:
 *
 *   - an optional PAX "x" header with only the records path, mtime, AGGAPI.sha256 and
 *     AGGAPI.previousSha256, each once, in the canonical "%d key=value\n" form;
 *   - a ustar header ("ustar\0", no prefix, zero device fields) of typeflag '0' whose
 *     numeric fields are zero-padded octal (parse._STD_FIELDS) and whose checksum is
 *     right;
 *   - a name that is the open directory's path, '/', and one more component (not
 *     "", ".", "..", no NUL), no "GNUSparseFile.";
 *   - digest records as aggapi.tar.entrydigest requires them; a wrong one is the
 *     Python path's to report (it reads the entry again), except the file's own sha256
 *     mismatch, returned so the caller raises the same IntegrityError.
 *
 * Anything else (an error included) ends the run before the entry changes any state.
 * A file is created O_CREAT|O_EXCL|O_NOFOLLOW at the directory fd (an existing name is
 * the Python path's to replace), written, hashed by the caller's hashlib.sha256, given
 * its mtime, fstat'ed (for hard links) and closed: Python's calls, without Python.
 * run() returns (pos, entries, bytes, after, written, mismatch, short).
 */
#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tar/_ustar.h"

static int str_is(PyObject *s, const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t len;
    const char *u = PyUnicode_AsUTF8AndSize(s, &len);
    return u != NULL && len == n && memcmp(u, p, (size_t)n) == 0;
}

static PyObject *run(PyObject *self, PyObject *args)
{
    Py_buffer data, prefix;
    Py_ssize_t pos, max_meta, max_records;
    int pfd, umask, trailing, required;
    PyObject *parts, *after, *written, *files, *sha256;
    if (!PyArg_ParseTuple(args, "y*ny*iO!iipOOO!Onn", &data, &pos, &prefix, &pfd,
                          &PyTuple_Type, &parts, &umask, &trailing, &required, &after,
                          &written, &PyDict_Type, &files, &sha256, &max_meta, &max_records))
        return NULL;
    const unsigned char *d = data.buf;
    Py_ssize_t end = data.len, nparts = PyTuple_GET_SIZE(parts);
    long long entries = 0, nbytes = 0;
    int shortp = 0; /* stopped at an entry cut by the piece's end */
    int fd = -1, err = 0; /* the file being written */
    PyObject *leafname = NULL, *got = NULL, *full = NULL, *key = NULL, *ident = NULL;
    PyObject *mismatch = Py_None, *result = NULL;
    Py_INCREF(after);
    Py_INCREF(written);
    Py_INCREF(mismatch);

    for (;;) {
        if (end - pos < BLOCK) {
            shortp = 1;
            break;
        }
        Py_ssize_t at = pos;
        const unsigned char *b = d + at;
        unsigned long long mode, size, mtime;
        Rec recs[R_COUNT] = {{0}};
        if (std_header(b, &mode, &size, &mtime))
            break;
        if (b[156] == 'x') {
            if ((Py_ssize_t)size > max_meta)
                break;
            Py_ssize_t meta = (Py_ssize_t)size, span = (meta + BLOCK - 1) / BLOCK * BLOCK;
            if (end - at - BLOCK < span + BLOCK) {
                shortp = 1;
                break;
            }
            if (pax_records(b + BLOCK, meta, max_records, recs, 1))
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
        Py_ssize_t span = (Py_ssize_t)((size + BLOCK - 1) / BLOCK * BLOCK);
        if (size > (unsigned long long)end || end - at - BLOCK < span) {
            shortp = 1; /* not whole in this piece */
            break;
        }
        long long mtime_ns = (long long)mtime * NS;
        if (recs[R_MTIME].set && pax_mtime(&recs[R_MTIME], &mtime_ns))
            break;
        /* The digest records, as entrydigest.EntryDigests checks them (an error there
         * is the Python path's to raise). */
        if (trailing) {
            if (recs[R_SHA].set || recs[R_PREV].set != (after != Py_None))
                break;
            if (recs[R_PREV].set) {
                if (!hex64(&recs[R_PREV]))
                    break;
                if (written != Py_None &&
                    !str_is(PyTuple_GET_ITEM(written, 1), recs[R_PREV].p, 64))
                    break;
            }
        } else {
            if (recs[R_PREV].set)
                break;
            if (recs[R_SHA].set ? !hex64(&recs[R_SHA]) : required)
                break;
        }

        /* Taken: create, write, hash, time, stat, close. */
        if (llen > 255)
            break; /* NAME_MAX: the Python path's error */
        char cleaf[256];
        memcpy(cleaf, leaf, (size_t)llen);
        cleaf[llen] = 0;
        const unsigned char *body = b + BLOCK;
        Py_ssize_t done = 0;
        err = 0;
        Py_BEGIN_ALLOW_THREADS
        fd = openat(pfd, cleaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                    (mode_t)(mode & 0777 & ~(unsigned)umask));
        while (fd >= 0 && done < (Py_ssize_t)size) {
            ssize_t w = write(fd, body + done, (size_t)((Py_ssize_t)size - done));
            if (w < 0 && errno != EINTR) {
                err = errno;
                break;
            }
            done += w > 0 ? w : 0;
        }
        Py_END_ALLOW_THREADS
        if (fd < 0)
            break; /* an existing name, or an error: the Python path's */
        leafname = got = full = key = ident = NULL;
        if (err)
            goto oserror;
        PyObject *view = PyMemoryView_FromMemory((char *)body, (Py_ssize_t)size, PyBUF_READ);
        PyObject *h = view ? PyObject_CallOneArg(sha256, view) : NULL;
        Py_XDECREF(view);
        got = h ? PyObject_CallMethod(h, "hexdigest", NULL) : NULL;
        Py_XDECREF(h);
        full = got ? PyUnicode_DecodeUTF8((const char *)leaf - prefix.len,
                                           llen + prefix.len, "surrogateescape") : NULL;
        leafname = full ? PyUnicode_DecodeUTF8((const char *)leaf, llen, "surrogateescape")
                        : NULL;
        if (leafname == NULL)
            goto entry_fail;
        if (!trailing && recs[R_SHA].set && !str_is(got, recs[R_SHA].p, 64)) {
            close(fd);
            Py_DECREF(mismatch);
            mismatch = Py_BuildValue("(OOs#)", full, got, recs[R_SHA].p, (Py_ssize_t)64);
            Py_DECREF(leafname);
            Py_DECREF(got);
            Py_DECREF(full);
            if (mismatch == NULL)
                goto fail;
            break;
        }
        struct stat st;
        struct timespec ts[2];
        ts[0].tv_sec = ts[1].tv_sec = (time_t)(mtime_ns / NS);
        ts[0].tv_nsec = ts[1].tv_nsec = (long)(mtime_ns % NS);
        Py_BEGIN_ALLOW_THREADS
        if (futimens(fd, ts) || fstat(fd, &st))
            err = errno;
        Py_END_ALLOW_THREADS
        if (err)
            goto oserror;
        close(fd);
        fd = -1;
        key = PyTuple_New(nparts + 1);
        ident = Py_BuildValue("(KK)", (unsigned long long)st.st_dev,
                              (unsigned long long)st.st_ino);
        if (key == NULL || ident == NULL)
            goto entry_fail;
        for (Py_ssize_t i = 0; i < nparts; i++) {
            PyObject *p = PyTuple_GET_ITEM(parts, i);
            Py_INCREF(p);
            PyTuple_SET_ITEM(key, i, p);
        }
        PyTuple_SET_ITEM(key, nparts, leafname);
        leafname = NULL;
        if (PyDict_SetItem(files, key, ident))
            goto entry_fail;
        if (trailing) {
            PyObject *w = PyTuple_Pack(2, full, got);
            if (w == NULL)
                goto entry_fail;
            Py_SETREF(written, w);
            Py_SETREF(after, full);
            full = NULL;
        }
        Py_XDECREF(full);
        Py_DECREF(got);
        Py_DECREF(key);
        Py_DECREF(ident);
        entries++;
        nbytes += (long long)size;
        pos = at + BLOCK + span;
    }
    result = Py_BuildValue("(nLLNNNi)", pos, entries, nbytes, after, written, mismatch,
                           shortp);
    PyBuffer_Release(&data);
    PyBuffer_Release(&prefix);
    return result;
oserror:
    errno = err;
    PyErr_SetFromErrno(PyExc_OSError);
entry_fail:
    if (fd >= 0)
        close(fd);
    Py_XDECREF(leafname);
    Py_XDECREF(got);
    Py_XDECREF(full);
    Py_XDECREF(key);
    Py_XDECREF(ident);
fail:
    Py_DECREF(after);
    Py_DECREF(written);
    Py_DECREF(mismatch);
    PyBuffer_Release(&data);
    PyBuffer_Release(&prefix);
    return NULL;
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS, "The plain files from pos on (aggapi.client.fastpath)."},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastextract",
                                    "aggapi.client.fastpath's compiled loop.", -1, methods};
PyMODINIT_FUNC PyInit__fastextract(void) { return PyModule_Create(&module); }
