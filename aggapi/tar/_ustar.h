/* The tar reading both compiled loops share (aggapi.client._fastextract, a download's
 * extraction on the user's side; aggapi.agent.copy._fastuntar, an upload's in the
 * container): ustar fields, x-header records and their values, each as
 * aggapi.tar.parse reads them, or "not taken here" (-1 / 0) for the Python path.
 * Included by both, after <Python.h> and <string.h>. */
#ifndef AGGAPI_USTAR_H
#define AGGAPI_USTAR_H

#define BLOCK 512
#define NS 1000000000LL

typedef struct {
    const unsigned char *p;
    Py_ssize_t n;
    int set;
} Rec;

enum { R_PATH, R_MTIME, R_SHA, R_PREV, R_COUNT };

static int octal(const unsigned char *p, int n, unsigned long long *out)
{
    unsigned long long v = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '7')
            return -1;
        v = v * 8 + (unsigned long long)(p[i] - '0');
    }
    *out = v;
    return 0;
}

/* The fields as parse._STD_FIELDS matches them, and a right checksum (unsigned, or the
 * old writers' signed sum, as parse accepts). 0, or -1: not taken here. */
static int std_header(const unsigned char *b, unsigned long long *mode,
                      unsigned long long *size, unsigned long long *mtime)
{
    unsigned long long uid, gid, chk;
    if (octal(b + 100, 7, mode) || b[107] || octal(b + 108, 7, &uid) || b[115] ||
        octal(b + 116, 7, &gid) || b[123] || octal(b + 124, 11, size) || b[135] ||
        octal(b + 136, 11, mtime) || b[147] || octal(b + 148, 6, &chk) || b[154] ||
        b[155] != ' ')
        return -1;
    long long sum = 256, high = 0;
    for (int i = 0; i < BLOCK; i++) {
        if (i < 148 || i >= 156)
            sum += b[i];
        high += b[i] > 127;
    }
    if ((long long)chk != sum && (long long)chk != sum - 256 * high)
        return -1;
    return 0;
}

static const unsigned char zeros[BLOCK];
#define has(p, n, s) (memmem((p), (size_t)(n), (s), sizeof(s) - 1) != NULL)
#define key_is(k, n, s) ((n) == sizeof(s) - 1 && memcmp((k), (s), sizeof(s) - 1) == 0)

/* The records of one x header, as parse.parse_pax reads them; -1: not taken here.
 * AGGAPI.previousSha256 is a record of its own only where ``with_prev`` (a download's
 * trailing digests); elsewhere it is not taken here. */
static int pax_records(const unsigned char *d, Py_ssize_t end, Py_ssize_t max_records,
                       Rec *recs, int with_prev)
{
    Py_ssize_t pos = 0, count = 0;
    while (pos < end) {
        if (d[pos] == 0)
            return -1; /* the rest would be ignored: the Python path's to read */
        Py_ssize_t sp = -1;
        for (Py_ssize_t i = pos; i < pos + 21 && i < end; i++)
            if (d[i] == ' ') {
                sp = i;
                break;
            }
        if (sp <= pos || sp - pos > 18)
            return -1;
        long long n = 0;
        for (Py_ssize_t i = pos; i < sp; i++) {
            if (d[i] < '0' || d[i] > '9')
                return -1;
            n = n * 10 + (d[i] - '0');
        }
        if (n <= sp - pos + 1 || pos + n > end || d[pos + n - 1] != '\n')
            return -1;
        const unsigned char *rec = d + sp + 1;
        Py_ssize_t rlen = pos + n - 1 - (sp + 1); /* without the newline */
        const unsigned char *eq = memchr(rec, '=', (size_t)rlen);
        if (eq == NULL || ++count > max_records)
            return -1;
        Py_ssize_t klen = eq - rec;
        int which;
        if (key_is(rec, klen, "path"))
            which = R_PATH;
        else if (key_is(rec, klen, "mtime"))
            which = R_MTIME;
        else if (key_is(rec, klen, "AGGAPI.sha256"))
            which = R_SHA;
        else if (with_prev && key_is(rec, klen, "AGGAPI.previousSha256"))
            which = R_PREV;
        else
            return -1;
        if (recs[which].set)
            return -1;
        recs[which].set = 1;
        recs[which].p = eq + 1;
        recs[which].n = rlen - klen - 1;
        pos += (Py_ssize_t)n;
    }
    return 0;
}

/* parse._pax_time_ns's usual form "SECONDS[.FRACTION]"; -1: not taken here. */
static int pax_mtime(const Rec *r, long long *ns)
{
    Py_ssize_t i = 0, n = r->n;
    long long sec = 0, frac = 0;
    int digits = 0;
    while (i < n && r->p[i] >= '0' && r->p[i] <= '9') {
        if (++digits > 10)
            return -1;
        sec = sec * 10 + (r->p[i++] - '0');
    }
    if (digits == 0 || sec > 9223372035LL)
        return -1;
    if (i < n) {
        if (r->p[i++] != '.' || n - i > 30)
            return -1;
        static const long long scale[9] = {100000000, 10000000, 1000000, 100000, 10000,
                                           1000, 100, 10, 1};
        for (int k = 0; i < n; i++, k++) {
            if (r->p[i] < '0' || r->p[i] > '9')
                return -1;
            if (k < 9)
                frac += (r->p[i] - '0') * scale[k];
        }
    }
    *ns = sec * NS + frac;
    return 0;
}

static int hex64(const Rec *r) /* entrydigest._HEX64 */
{
    if (!r->set || r->n != 64)
        return 0;
    for (int i = 0; i < 64; i++)
        if (!((r->p[i] >= '0' && r->p[i] <= '9') || (r->p[i] >= 'a' && r->p[i] <= 'f')))
            return 0;
    return 1;
}

/* A plain regular file in ustar form (header block ``b``, its x records ``recs``) named
 * one leaf directly below ``prefix``, as both loops take it: its leaf; 0: not taken here
 * (sparse, a link, a deeper or odd name: the Python path's). */
static int plain_leaf(const unsigned char *b, const Rec *recs, const Py_buffer *prefix,
                      const unsigned char **leaf, Py_ssize_t *llen)
{
    if (b[156] != '0' || memcmp(b + 257, "ustar\0", 6) != 0 ||
        memcmp(b + 329, "0000000\0" "0000000\0", 16) != 0 || memcmp(b + 345, zeros, 155) != 0)
        return 0;
    Py_ssize_t rawlen = 0;
    while (rawlen < 100 && b[rawlen])
        rawlen++;
    const unsigned char *name = recs[R_PATH].set ? recs[R_PATH].p : b;
    Py_ssize_t nlen = recs[R_PATH].set ? recs[R_PATH].n : rawlen;
    if (has(name, nlen, "GNUSparseFile.") || has(b, rawlen, "GNUSparseFile."))
        return 0;
    Py_ssize_t plen = prefix->len;
    if (nlen <= plen || memcmp(name, prefix->buf, (size_t)plen) != 0)
        return 0;
    const unsigned char *l = name + plen;
    Py_ssize_t n = nlen - plen;
    if (memchr(l, '/', (size_t)n) || memchr(l, 0, (size_t)n) || (n == 1 && l[0] == '.') ||
        (n == 2 && l[0] == '.' && l[1] == '.'))
        return 0;
    *leaf = l;
    *llen = n;
    return 1;
}

#endif
