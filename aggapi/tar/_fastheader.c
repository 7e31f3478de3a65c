/* The tar writer's two per-entry builders, compiled (issue 35, item 6).
 *
 * aggapi.tar.stream builds a ustar block and a PAX header's records for every entry a
 * walk sends: in the agent's download of a tree of small files that was about half of
 * the walk's CPU. These are pure functions of their arguments, byte for byte those of
 * stream._ustar_py and stream._records_py (the reference, and the fallback):
 *
 *   ustar(name, typeflag, size, mode, uid, gid, mtime, linkname) -> bytes | None
 *       None when a number needs stream._field's fallback (negative, or too big for
 *       its octal field): the Python path builds that block.
 *   records(mapping) -> bytes
 *       every "%d key=value\n" record, in the mapping's order, key and value encoded
 *       UTF-8 with surrogateescape (an unencodable one raises as str.encode does).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdio.h>
#include <string.h>

#define BLOCK 512

static void octal(char *dst, int digits, unsigned long long v)
{
    for (int i = digits - 1; i >= 0; i--, v >>= 3)
        dst[i] = (char)('0' + (v & 7));
    dst[digits] = 0;
}

static PyObject *ustar(PyObject *self, PyObject *args)
{
    Py_buffer name, type, link;
    long long size, mode, uid, gid, mtime;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*LLLLLy*", &name, &type, &size, &mode, &uid, &gid, &mtime,
                          &link))
        return NULL;
    PyObject *out = NULL;
    const long long max8 = 1LL << 21, max12 = 1LL << 33; /* 8**7, 8**11 */
    if (size < 0 || mode < 0 || uid < 0 || gid < 0 || mtime < 0 || mode >= max8 ||
        uid >= max8 || gid >= max8 || size >= max12 || mtime >= max12) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    char h[BLOCK];
    memset(h, 0, BLOCK);
    memcpy(h, name.buf, (size_t)(name.len < 100 ? name.len : 100));
    octal(h + 100, 7, (unsigned long long)mode);
    octal(h + 108, 7, (unsigned long long)uid);
    octal(h + 116, 7, (unsigned long long)gid);
    octal(h + 124, 11, (unsigned long long)size);
    octal(h + 136, 11, (unsigned long long)mtime);
    memset(h + 148, ' ', 8);
    if (type.len)
        h[156] = ((const char *)type.buf)[0];
    memcpy(h + 157, link.buf, (size_t)(link.len < 100 ? link.len : 100));
    memcpy(h + 257, "ustar\0" "00", 8);
    memcpy(h + 329, "0000000\0" "0000000\0", 16);
    unsigned long sum = 0;
    for (int i = 0; i < BLOCK; i++)
        sum += (unsigned char)h[i];
    octal(h + 148, 6, sum);
    h[155] = ' ';
    out = PyBytes_FromStringAndSize(h, BLOCK);
done:
    PyBuffer_Release(&name);
    PyBuffer_Release(&type);
    PyBuffer_Release(&link);
    return out;
}

static PyObject *encoded(PyObject *s)
{
    if (!PyUnicode_Check(s)) {
        PyErr_SetString(PyExc_TypeError, "PAX record keys and values are str");
        return NULL;
    }
    return PyUnicode_AsEncodedString(s, "utf-8", "surrogateescape");
}

static PyObject *records(PyObject *self, PyObject *mapping)
{
    (void)self;
    PyObject *items = PyMapping_Items(mapping);
    if (items == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *parts = PyList_New(0), *out = NULL;
    if (parts == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *kv = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(kv) || PyTuple_GET_SIZE(kv) != 2) {
            PyErr_SetString(PyExc_TypeError, "mapping items are pairs");
            goto done;
        }
        PyObject *k = encoded(PyTuple_GET_ITEM(kv, 0));
        PyObject *v = k ? encoded(PyTuple_GET_ITEM(kv, 1)) : NULL;
        if (v == NULL) {
            Py_XDECREF(k);
            goto done;
        }
        Py_ssize_t klen = PyBytes_GET_SIZE(k), vlen = PyBytes_GET_SIZE(v);
        Py_ssize_t body = klen + vlen + 3; /* " key=value\n" */
        Py_ssize_t len = body + 1;
        char digits[32];
        for (;;) { /* the length counts its own digits */
            int d = snprintf(digits, sizeof digits, "%zd", len);
            if (d + body == len)
                break;
            len = d + body;
        }
        Py_ssize_t dl = (Py_ssize_t)strlen(digits);
        PyObject *rec = PyBytes_FromStringAndSize(NULL, len);
        if (rec != NULL) {
            char *p = PyBytes_AS_STRING(rec);
            memcpy(p, digits, (size_t)dl);
            p[dl] = ' ';
            memcpy(p + dl + 1, PyBytes_AS_STRING(k), (size_t)klen);
            p[dl + 1 + klen] = '=';
            memcpy(p + dl + 2 + klen, PyBytes_AS_STRING(v), (size_t)vlen);
            p[len - 1] = '\n';
        }
        Py_DECREF(k);
        Py_DECREF(v);
        if (rec == NULL || PyList_Append(parts, rec)) {
            Py_XDECREF(rec);
            goto done;
        }
        Py_DECREF(rec);
    }
    PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
    if (empty != NULL) {
        out = PyObject_CallMethod(empty, "join", "O", parts);
        Py_DECREF(empty);
    }
done:
    Py_DECREF(items);
    Py_XDECREF(parts);
    return out;
}

static PyMethodDef methods[] = {
    {"ustar", ustar, METH_VARARGS, "One ustar header block (aggapi.tar.stream._ustar_py)."},
    {"records", records, METH_O, "A PAX header's records (aggapi.tar.stream._records_py)."},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastheader",
                                    "aggapi.tar.stream's compiled header builders.", -1,
                                    methods};
PyMODINIT_FUNC PyInit__fastheader(void) { return PyModule_Create(&module); }
