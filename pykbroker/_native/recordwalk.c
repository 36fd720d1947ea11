/*
 * recordwalk: the per-record framing walk of a v2 record batch's (uncompressed) records region.
 *
 * The produce path validates every record the way Kafka's DefaultRecord reader does, which in
 * Python would cost more than the rest of the append.  This walk only reads varints and skips
 * key, value and header bytes; it returns the facts the validator needs, or Kafka's message for
 * the first framing error.  pykbroker/protocol/record_validator.py holds the identical pure-Python
 * walk (the fallback, and the reference the tests hold this code to).
 *
 * walk(buf, start, end, count) -> (error, min_ts_delta, max_ts_delta, first_ts_delta, null_keys, flags)
 *   error: None, or the message of an INVALID_RECORD framing error (then the other fields are 0)
 *   flags: 1 = offset deltas are 0..count-1 in order, 2 = every record's attributes byte is 0
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum { RW_OK = 0, RW_EOF = 1, RW_BAD = 2 };

/* Kafka's ByteUtils.readVarint: at most 5 bytes, bits past 32 dropped, zig-zag decoded. */
static inline int read_varint(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t end, int32_t *out)
{
    if (*pos < end && p[*pos] < 0x80) { /* one byte: the common case (small lengths and deltas) */
        uint32_t v = p[(*pos)++];
        *out = (int32_t)((v >> 1) ^ (uint32_t)(-(int32_t)(v & 1)));
        return RW_OK;
    }
    uint32_t value = 0;
    int shift = 0;
    for (;;) {
        if (*pos >= end)
            return RW_EOF;
        uint32_t b = p[(*pos)++];
        if (!(b & 0x80)) {
            value |= b << shift;
            break;
        }
        value |= (b & 0x7f) << shift;
        shift += 7;
        if (shift > 28)
            return RW_BAD;
    }
    *out = (int32_t)((value >> 1) ^ (uint32_t)(-(int32_t)(value & 1)));
    return RW_OK;
}

/* Kafka's ByteUtils.readVarlong: at most 10 bytes. */
static inline int read_varlong(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t end, int64_t *out)
{
    uint64_t value = 0;
    int shift = 0;
    for (;;) {
        if (*pos >= end)
            return RW_EOF;
        uint64_t b = p[(*pos)++];
        if (!(b & 0x80)) {
            value |= b << shift;
            break;
        }
        value |= (b & 0x7f) << shift;
        shift += 7;
        if (shift > 63)
            return RW_BAD;
    }
    *out = (int64_t)((value >> 1) ^ (uint64_t)(-(int64_t)(value & 1)));
    return RW_OK;
}

#define STRUCTURE "Found invalid record structure"

static PyObject *fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (msg == NULL)
        return NULL;
    return Py_BuildValue("(Niiiii)", msg, 0, 0, 0, 0, 0);
}

/* Skip a length-prefixed field; a negative length is null.  Returns RW_OK or RW_BAD/RW_EOF. */
static inline int skip_field(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t end, int32_t *len)
{
    int rc = read_varint(p, pos, end, len);
    if (rc != RW_OK)
        return rc;
    if (*len >= 0) {
        if ((Py_ssize_t)*len > end - *pos)
            return RW_BAD;
        *pos += *len;
    }
    return RW_OK;
}

static PyObject *walk(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end;
    long long count;
    if (!PyArg_ParseTuple(args, "y*nnL", &view, &start, &end, &count))
        return NULL;
    if (start < 0 || end > view.len || start > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "records region out of the buffer's bounds");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)view.buf;
    Py_ssize_t pos = start;
    int64_t min_d = INT64_MAX, max_d = INT64_MIN, first_d = 0;
    long long null_keys = 0;
    int in_order = 1, attrs_zero = 1;
    PyObject *result = NULL;

    for (long long i = 0; i < count; i++) {
        int32_t size;
        int rc = read_varint(p, &pos, end, &size);
        if (rc == RW_EOF) {
            result = fail("Incorrect declared batch size, premature EOF reached");
            goto done;
        }
        if (rc == RW_BAD) {
            result = fail(STRUCTURE);
            goto done;
        }
        if (end - pos < (Py_ssize_t)size) {
            result = fail("Invalid record size: expected %d bytes in record payload, but instead the buffer has "
                          "only %zd remaining bytes.", (int)size, end - pos);
            goto done;
        }
        Py_ssize_t rec_start = pos;
        if (pos >= end) {
            result = fail(STRUCTURE);
            goto done;
        }
        unsigned char attributes = p[pos++];
        int64_t ts_delta;
        int32_t offset_delta, key_len, value_len, n_headers;
        if (read_varlong(p, &pos, end, &ts_delta) != RW_OK || read_varint(p, &pos, end, &offset_delta) != RW_OK
            || skip_field(p, &pos, end, &key_len) != RW_OK || skip_field(p, &pos, end, &value_len) != RW_OK
            || read_varint(p, &pos, end, &n_headers) != RW_OK) {
            result = fail(STRUCTURE);
            goto done;
        }
        if (n_headers < 0) {
            result = fail("Found invalid number of record headers %d", (int)n_headers);
            goto done;
        }
        if ((Py_ssize_t)n_headers > end - pos) {
            result = fail("Found invalid number of record headers. %d is larger than the remaining size of the "
                          "buffer", (int)n_headers);
            goto done;
        }
        for (int32_t h = 0; h < n_headers; h++) {
            int32_t hkey_len, hvalue_len;
            if (read_varint(p, &pos, end, &hkey_len) != RW_OK) {
                result = fail(STRUCTURE);
                goto done;
            }
            if (hkey_len < 0) {
                result = fail("Invalid negative header key size %d", (int)hkey_len);
                goto done;
            }
            if ((Py_ssize_t)hkey_len > end - pos) {
                result = fail(STRUCTURE);
                goto done;
            }
            pos += hkey_len;
            if (skip_field(p, &pos, end, &hvalue_len) != RW_OK) {
                result = fail(STRUCTURE);
                goto done;
            }
        }
        if (pos - rec_start != (Py_ssize_t)size) {
            result = fail("Invalid record size: expected to read %d bytes in record payload, but instead read %zd",
                          (int)size, pos - rec_start);
            goto done;
        }
        if (i == 0)
            first_d = ts_delta;
        if (ts_delta < min_d)
            min_d = ts_delta;
        if (ts_delta > max_d)
            max_d = ts_delta;
        if (key_len < 0)
            null_keys++;
        if ((long long)offset_delta != i)
            in_order = 0;
        if (attributes != 0)
            attrs_zero = 0;
    }
    if (pos != end) {
        result = fail("Incorrect declared batch size, records still remaining in file");
        goto done;
    }
    if (count <= 0) {
        min_d = 0;
        max_d = 0;
    }
    result = Py_BuildValue("(OLLLLi)", Py_None, (long long)min_d, (long long)max_d, (long long)first_d, null_keys,
                           in_order | (attrs_zero << 1));
done:
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(buf, start, end, count) -> (error, min_ts_delta, max_ts_delta, first_ts_delta, null_keys, flags)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pykbroker._native.recordwalk", "Per-record framing walk of v2 record batches.", -1,
    methods,
};

PyMODINIT_FUNC PyInit_recordwalk(void)
{
    return PyModule_Create(&module);
}
