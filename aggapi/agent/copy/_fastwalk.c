/* The per-file loop of a directory download's walk, compiled (issue 35).
 *
 * aggapi.agent.copy.tarwalk.TarWalker sends a tree as a PAX tar; with digest=trailer (what
 * ncp asks) each regular file is read once, hashed, and its sha256 goes on the entry
 * after it. In a tree of small files most of the agent's CPU was the interpreter around
 * the few syscalls each file takes. This loop takes, from a directory's sorted names,
 * the run of entries that are each:
 *
 *   a regular file (fstatat, AT_SYMLINK_NOFOLLOW) of at most CHUNK bytes, one link, on
 *   the directory's own file system, its name and the path before it ASCII, its ids
 *   (mapped into the container) and its mtime within the ustar fields, within the
 *   walk's entry and byte limits,
 *
 * with exactly the Python path's calls, each confined the same way: openat(dfd, name,
 * O_PATH|O_NOFOLLOW) under the walked directory's fd (never a path), fstat; the very
 * inode re-opened for reading through /proc/self/fd (a name swapped for a device or
 * FIFO is never opened), fstat again (same dev and inode), one pread of the size fstat
 * gave, sha256 (the caller's hashlib), and the entry's header blocks byte for byte as
 * aggapi.tar.stream.header builds them. It stops, before anything of that entry is
 * counted or sent, at the first entry that is not so or whose call fails, and returns
 * where it stopped: the Python walker (the reference) takes that entry, with its skip
 * reasons, links, limits and errors. Memory: one piece of at most ``budget`` bytes plus
 * one file.
 *
 *   files(dfd, dev, names, start, prefix, owed, entries, size, max_entries, size_limit,
 *         uid_ranges, gid_ranges, budget, sha256)
 *     -> (next, piece, entries, size, owed)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BLOCK 512
#define CHUNK (1 << 20)
#define MAX8 (1LL << 21)  /* 8**7: an 8-byte octal field */
#define MAX12 (1LL << 33) /* 8**11: a 12-byte one */

static void put_octal(char *dst, int digits, unsigned long long v)
{
    for (int i = digits - 1; i >= 0; i--, v >>= 3)
        dst[i] = (char)('0' + (v & 7));
    dst[digits] = 0;
}

/* stream._ustar for numbers that fit (the caller checked), no link name. */
static void ustar(char *h, const char *name, Py_ssize_t nlen, char typeflag,
                  long long size, long long mode, long long uid, long long gid,
                  long long mtime)
{
    memset(h, 0, BLOCK);
    memcpy(h, name, (size_t)(nlen < 100 ? nlen : 100));
    put_octal(h + 100, 7, (unsigned long long)mode);
    put_octal(h + 108, 7, (unsigned long long)uid);
    put_octal(h + 116, 7, (unsigned long long)gid);
    put_octal(h + 124, 11, (unsigned long long)size);
    put_octal(h + 136, 11, (unsigned long long)mtime);
    memset(h + 148, ' ', 8);
    h[156] = typeflag;
    memcpy(h + 257, "ustar\0" "00", 8);
    memcpy(h + 329, "0000000\0" "0000000\0", 16);
    unsigned long sum = 0;
    for (int i = 0; i < BLOCK; i++)
        sum += (unsigned char)h[i];
    put_octal(h + 148, 6, sum);
    h[155] = ' ';
}

/* One "%d key=value\n" record (the length counts its own digits), appended at r. */
static Py_ssize_t record(char *r, const char *key, const char *val, Py_ssize_t vlen)
{
    Py_ssize_t body = 1 + (Py_ssize_t)strlen(key) + 1 + vlen + 1; /* " key=value\n" */
    Py_ssize_t n = body + 1;
    for (;;) {
        char digits[24];
        Py_ssize_t d = snprintf(digits, sizeof digits, "%zd", n);
        if (d + body == n)
            break;
        n = d + body;
    }
    Py_ssize_t d = snprintf(r, 24, "%zd", n);
    r[d] = ' ';
    memcpy(r + d + 1, key, strlen(key));
    r[d + 1 + strlen(key)] = '=';
    memcpy(r + d + 2 + strlen(key), val, (size_t)vlen);
    r[n - 1] = '\n';
    return n;
}

/* IdMap.to_container over its (inside, outside, count) ranges; -1 on a bad map. */
static long long to_container(PyObject *ranges, unsigned long long hid)
{
    Py_ssize_t n = PyTuple_GET_SIZE(ranges);
    for (Py_ssize_t i = 0; i < n; i++) {
        long long in, out, count;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(ranges, i), "LLL", &in, &out, &count))
            return -1;
        if ((long long)hid >= out && (long long)hid < out + count)
            return in + ((long long)hid - out);
    }
    return 65534; /* idmap.OVERFLOW_ID */
}

/* The reading fd of a regular file ``name`` in ``dfd`` (fstat into *st), as tarwalk._file
 * and download.reopen open it; -1: not taken here (nothing is left open). */
static int open_regular(int dfd, const char *name, unsigned long long dev, struct stat *st)
{
    /* One name of the directory (scandir's): never a path, never "." or "..". */
    if (strchr(name, '/') != NULL || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return -1;
    int pfd = openat(dfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (pfd < 0)
        return -1;
    if (fstat(pfd, st) != 0 || !S_ISREG(st->st_mode) || (unsigned long long)st->st_dev != dev ||
        st->st_nlink > 1 || st->st_size > CHUNK) {
        close(pfd);
        return -1;
    }
    char path[40];
    snprintf(path, sizeof path, "/proc/self/fd/%d", pfd);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    close(pfd);
    if (fd < 0)
        return -1;
    struct stat nst;
    if (fstat(fd, &nst) != 0 || nst.st_dev != st->st_dev || nst.st_ino != st->st_ino) {
        close(fd);
        return -1;
    }
    return fd;
}

/* For the tests: the fd open_regular gives ``name`` (the caller closes it), or None. */
static PyObject *py_open_regular(PyObject *self, PyObject *args)
{
    int dfd;
    const char *name;
    unsigned long long dev;
    (void)self;
    if (!PyArg_ParseTuple(args, "isK", &dfd, &name, &dev))
        return NULL;
    struct stat st;
    int fd;
    Py_BEGIN_ALLOW_THREADS
    fd = open_regular(dfd, name, dev, &st);
    Py_END_ALLOW_THREADS
    if (fd < 0)
        Py_RETURN_NONE;
    return PyLong_FromLong(fd);
}

static PyObject *files(PyObject *self, PyObject *args)
{
    int dfd;
    unsigned long long dev;
    PyObject *names, *prefix, *owed, *uids, *gids, *sha256;
    Py_ssize_t start, budget;
    long long entries, size, max_entries, size_limit;
    (void)self;
    if (!PyArg_ParseTuple(args, "iKO!nUOLLLLO!O!nO", &dfd, &dev, &PyList_Type, &names, &start,
                          &prefix, &owed, &entries, &size, &max_entries, &size_limit,
                          &PyTuple_Type, &uids, &PyTuple_Type, &gids, &budget, &sha256))
        return NULL;
    if (owed != Py_None && !PyUnicode_Check(owed)) {
        PyErr_SetString(PyExc_TypeError, "owed is a str or None");
        return NULL;
    }
    Py_ssize_t plen = 0;
    const char *pre = "";
    /* ASCII first: a name with surrogate escapes has no UTF-8 of its own (the Python
     * path encodes it with surrogateescape, and adds its path record). */
    if (PyUnicode_IS_ASCII(prefix) && (pre = PyUnicode_AsUTF8AndSize(prefix, &plen)) == NULL)
        return NULL;
    Py_INCREF(owed);
    /* Made for the first file taken: a call that takes none (a directory, a link) costs
     * no buffer. */
    PyObject *out = NULL;
    char *o = NULL;
    Py_ssize_t used = 0, i = start;
    char rel[4096 + 256];
    if (!PyUnicode_IS_ASCII(prefix) || plen > 4096)
        goto stop; /* a path the Python path builds its records for */
    memcpy(rel, pre, (size_t)plen);
    for (; i < PyList_GET_SIZE(names) && used < budget; i++) {
        PyObject *n = PyList_GET_ITEM(names, i);
        if (!PyUnicode_Check(n) || !PyUnicode_IS_ASCII(n))
            break;
        Py_ssize_t nlen;
        const char *name = PyUnicode_AsUTF8AndSize(n, &nlen);
        if (name == NULL || nlen > 255 || (Py_ssize_t)strlen(name) != nlen)
            break;
        Py_ssize_t rlen = plen + nlen;
        memcpy(rel + plen, name, (size_t)nlen);
        struct stat st, fst;
        int fd = -1, ok;
        Py_BEGIN_ALLOW_THREADS
        ok = strchr(name, '/') == NULL && fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
             S_ISREG(st.st_mode);
        if (ok)
            fd = open_regular(dfd, name, dev, &fst);
        Py_END_ALLOW_THREADS
        if (fd < 0)
            break;
        long long sz = (long long)fst.st_size;
        long long uid = to_container(uids, st.st_uid), gid = to_container(gids, st.st_gid);
        long long sec = (long long)st.st_mtim.tv_sec, ns = (long long)st.st_mtim.tv_nsec;
        if (uid < 0 || gid < 0) { /* a map that is not (int, int, int) triples */
            close(fd);
            goto fail;
        }
        if (uid >= MAX8 || gid >= MAX8 || sec < 0 || sec >= MAX12 || entries + 1 > max_entries ||
            size + sz > size_limit) {
            close(fd); /* records, or a 413: the Python path's */
            break;
        }
        if (out == NULL) {
            out = PyBytes_FromStringAndSize(NULL, budget + CHUNK + 16 * BLOCK);
            if (out == NULL) {
                close(fd);
                goto fail;
            }
            o = PyBytes_AS_STRING(out);
        }
        PyObject *data = PyBytes_FromStringAndSize(NULL, sz);
        if (data == NULL) {
            close(fd);
            goto fail;
        }
        ssize_t got = 0;
        if (sz) {
            Py_BEGIN_ALLOW_THREADS
            got = pread(fd, PyBytes_AS_STRING(data), (size_t)sz, 0);
            Py_END_ALLOW_THREADS
        }
        close(fd);
        if (got != sz) { /* shrank, or an error: its skip record is the Python path's */
            Py_DECREF(data);
            break;
        }
        PyObject *h = PyObject_CallOneArg(sha256, data);
        PyObject *hex = h ? PyObject_CallMethod(h, "hexdigest", NULL) : NULL;
        Py_XDECREF(h);
        Py_ssize_t hexlen = 0;
        const char *hx = hex ? PyUnicode_AsUTF8AndSize(hex, &hexlen) : NULL;
        if (hx == NULL) {
            Py_DECREF(data);
            Py_XDECREF(hex);
            goto fail;
        }
        /* stream.header(rel, REG, size, mode, uid, gid, mtime_ns, records=previous(owed)):
         * path (a name over 100 bytes), mtime (a fraction), then the owed digest. */
        char recs[8192];
        Py_ssize_t rn = 0;
        if (rlen > 100)
            rn += record(recs + rn, "path", rel, rlen);
        if (ns) {
            char t[40];
            int tl = snprintf(t, sizeof t, "%lld.%09lld", sec, ns);
            while (t[tl - 1] == '0')
                tl--;
            rn += record(recs + rn, "mtime", t, tl);
        }
        if (owed != Py_None) {
            Py_ssize_t olen;
            const char *ov = PyUnicode_AsUTF8AndSize(owed, &olen);
            if (ov == NULL || olen > 128) {
                Py_DECREF(data);
                Py_DECREF(hex);
                if (ov == NULL)
                    goto fail;
                break;
            }
            rn += record(recs + rn, "AGGAPI.previousSha256", ov, olen);
        }
        if (rn) {
            char pname[10 + 80];
            Py_ssize_t keep = rlen < 80 ? rlen : 80;
            memcpy(pname, "PaxHeader/", 10);
            memcpy(pname + 10, rel + rlen - keep, (size_t)keep);
            ustar(o + used, pname, 10 + keep, 'x', rn, 0644, 0, 0, 0);
            used += BLOCK;
            memcpy(o + used, recs, (size_t)rn);
            used += rn;
            Py_ssize_t padn = (BLOCK - rn % BLOCK) % BLOCK;
            memset(o + used, 0, (size_t)padn);
            used += padn;
        }
        const char *uname = rlen <= 100 ? rel : rel + rlen - 100;
        ustar(o + used, uname, rlen <= 100 ? rlen : 100, '0', sz, st.st_mode & 07777, uid, gid,
              sec);
        used += BLOCK;
        memcpy(o + used, PyBytes_AS_STRING(data), (size_t)sz);
        used += sz;
        Py_ssize_t padn = (BLOCK - sz % BLOCK) % BLOCK;
        memset(o + used, 0, (size_t)padn);
        used += padn;
        Py_DECREF(data);
        Py_SETREF(owed, hex);
        entries += 1;
        size += sz;
    }
stop:
    if (out == NULL)
        out = PyBytes_FromStringAndSize(NULL, 0);
    else if (_PyBytes_Resize(&out, used) != 0)
        out = NULL; /* (freed by the resize) */
    if (out == NULL) {
        Py_DECREF(owed);
        return NULL;
    }
    PyObject *res = Py_BuildValue("(nNLLN)", i, out, entries, size, owed);
    return res;
fail:
    Py_XDECREF(out);
    Py_DECREF(owed);
    return NULL;
}

static PyMethodDef methods[] = {
    {"files", files, METH_VARARGS, "The run of plain small files from names[start:]."},
    {"open_regular", py_open_regular, METH_VARARGS, "open_regular(dfd, name, dev): fd or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastwalk", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastwalk(void)
{
    return PyModule_Create(&module);
}
