/*
 * schemas._wire_native: the compiled twin of the generated TupleData -> Avro row encoders
 * (schemas/row_encoder.py, schemas/row_encoder_statements.py).
 *
 * Why C: the generated Python encoder is already one straight-line function per table, and
 * profiled it is still the largest single cost of the producer's stream loop (about 40 % of
 * it for an 8-column row): what is left is the interpreter itself, slicing each value into a
 * bytes object, int(), the list of parts and its join. No library encodes pgoutput TupleData
 * into Avro (fastavro encodes Python objects, after they have been converted), so this file
 * does only that loop.
 *
 * The Python module schemas.native_encoder decides, per column and per wire format, one of
 * the operations below, with the same conditions as the generated Python statements, and
 * hands each column a Python fallback: the generated statements for that one column. Any
 * value the native operation does not handle exactly (an integer that is not plain digits, a
 * numeric with more than 18 digits, a timestamp at another offset than +00, a quoted array
 * item, an interval, ...) goes to that fallback, so the bytes are the Python path's by
 * construction. A failure the Python path would answer with "None, take the careful path"
 * (its CONVERSION_FAILURES) is answered the same way here. The same plans also encode COPY
 * text rows for snapshots (CopyEncoder, below). Tests (tests/unit/test_wire_native.py)
 * compare both paths byte for byte on every mapped type, edge values, random and mutated
 * TupleData and COPY lines; docs/development.md says how to run them under ASan and UBSan.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum op {
    OP_CALL = 0,      /* the column's Python fallback, always */
    OP_TEXT = 1,      /* UTF-8 text as it is: prefix + length + bytes (checked UTF-8) */
    OP_RAW = 2,       /* bytes as they are: prefix + length + bytes */
    OP_JSONB_BIN = 3, /* jsonb binary: version byte 1, then text */
    OP_INT_TEXT = 4,  /* decimal digits: prefix + zig-zag long */
    OP_INT2_BIN = 5,
    OP_INT4_BIN = 6,
    OP_INT8_BIN = 7,
    OP_OID_BIN = 8,
    OP_BOOL_TEXT = 9,    /* t/f: branch 1 + boolean */
    OP_BOOL_BIN = 10,    /* one byte: branch 1 + boolean */
    OP_FLOAT8_BIN = 11,  /* big-endian IEEE double: branch 1 + the 8 bytes reversed */
    OP_NUMERIC_TEXT = 12, /* numeric(p,s) text with `arg` fractional digits: branch 1 + decimal */
    OP_TEXT_ARRAY = 13,   /* {a,b,NULL} of text-like items, delimiter `arg`: branch 1 + array */
    OP_TIMESTAMPTZ_TEXT = 14, /* 'YYYY-MM-DD HH:MM:SS[.ffffff]+00': branch 1 + micros */
    OP_TIMESTAMP_TEXT = 15,   /* the same without the offset */
    OP_LAST = 15
};

typedef struct {
    int op;
    int arg;
    Py_ssize_t prefix_len;
    unsigned char prefix[8]; /* the union branch, zig-zag encoded */
    PyObject *fallback;      /* (bytes) -> bytes: the Python statements for this value */
} Plan;

typedef struct {
    Plan text, binary;
    PyObject *name; /* str: the column's name, for unchanged_toast */
    int in_key;     /* a key column: unchanged TOAST there is refused */
} Column;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_ssize_t width;
    Column *columns;
    Py_ssize_t key_count; /* -1: no fused key (the 3rd result is None) */
    Py_ssize_t *key_order; /* column positions, in the key record's field order */
    PyObject *failures;    /* the exception classes that mean "not handled here" */
} TupleEncoder;

/* --- output buffer ------------------------------------------------------------------------ */

typedef struct {
    unsigned char *data;
    Py_ssize_t len, cap;
    unsigned char local[1024];
} Out;

static void out_init(Out *o) {
    o->data = o->local;
    o->len = 0;
    o->cap = (Py_ssize_t)sizeof(o->local);
}

static void out_free(Out *o) {
    if (o->data != o->local) PyMem_Free(o->data);
}

static int out_reserve(Out *o, Py_ssize_t extra) {
    if (o->len + extra <= o->cap) return 0;
    Py_ssize_t cap = o->cap;
    while (cap < o->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    unsigned char *data = PyMem_Malloc((size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(data, o->data, (size_t)o->len);
    out_free(o);
    o->data = data;
    o->cap = cap;
    return 0;
}

static int out_put(Out *o, const void *src, Py_ssize_t n) {
    if (out_reserve(o, n) < 0) return -1;
    memcpy(o->data + o->len, src, (size_t)n);
    o->len += n;
    return 0;
}

/* Avro long: zig-zag, then base-128 groups, low first (at most 10 bytes). */
static int out_long(Out *o, int64_t value) {
    uint64_t n = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    if (out_reserve(o, 10) < 0) return -1;
    unsigned char *p = o->data + o->len;
    while (n > 0x7F) {
        *p++ = (unsigned char)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    *p++ = (unsigned char)n;
    o->len = p - o->data;
    return 0;
}

static int out_prefixed(Out *o, const Plan *plan, const unsigned char *d, Py_ssize_t n) {
    if (out_put(o, plan->prefix, plan->prefix_len) < 0) return -1;
    if (out_long(o, (int64_t)n) < 0) return -1;
    return out_put(o, d, n);
}

/* --- values ------------------------------------------------------------------------------- */

/* 1: handled, 0: not handled (the fallback decides), -1: a Python error is set. */
typedef int status;

static int is_ascii(const unsigned char *d, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (d[i] & 0x80) return 0;
    return 1;
}

/* Valid UTF-8, as Python's strict decoder says (the generated encoder checks with
 * bytes.decode(), so the two must refuse exactly the same bytes); ASCII needs no decoder. */
static int valid_utf8(const unsigned char *d, Py_ssize_t n) {
    if (is_ascii(d, n)) return 1;
    PyObject *text = PyUnicode_DecodeUTF8((const char *)d, n, "strict");
    if (text == NULL) {
        PyErr_Clear(); /* the fallback raises the same UnicodeDecodeError, or the caller refuses */
        return 0;
    }
    Py_DECREF(text);
    return 1;
}

/* Strictly '-'? digits, at most 18 digits: what PostgreSQL prints for int2/int4/int8/oid. */
static int parse_plain_int(const unsigned char *d, Py_ssize_t n, int64_t *out) {
    Py_ssize_t i = 0;
    int negative = 0;
    if (n > 0 && d[0] == '-') {
        negative = 1;
        i = 1;
    }
    if (i == n || n - i > 18) return 0;
    int64_t x = 0;
    for (; i < n; i++) {
        if (d[i] < '0' || d[i] > '9') return 0;
        x = x * 10 + (d[i] - '0');
    }
    *out = negative ? -x : x;
    return 1;
}

/* numeric(p,s) text with exactly `scale` fractional digits, 18 digits at most in all. */
static int parse_scaled(const unsigned char *d, Py_ssize_t n, int scale, int64_t *out) {
    Py_ssize_t i = 0, digits = 0;
    int negative = 0;
    if (n > 0 && d[0] == '-') {
        negative = 1;
        i = 1;
    }
    int64_t x = 0;
    Py_ssize_t whole = 0;
    for (; i < n && d[i] != '.'; i++, whole++) {
        if (d[i] < '0' || d[i] > '9') return 0;
        x = x * 10 + (d[i] - '0');
        if (++digits > 18) return 0;
    }
    if (whole == 0) return 0;
    if (scale == 0) {
        if (i != n) return 0;
    } else {
        if (i == n || n - i - 1 != scale) return 0;
        for (i++; i < n; i++) {
            if (d[i] < '0' || d[i] > '9') return 0;
            x = x * 10 + (d[i] - '0');
            if (++digits > 18) return 0;
        }
    }
    *out = negative ? -x : x;
    return 1;
}

static status put_int(Out *o, const Plan *plan, int64_t x) {
    if (out_put(o, plan->prefix, plan->prefix_len) < 0) return -1;
    return out_long(o, x) < 0 ? -1 : 1;
}

static uint64_t be_uint(const unsigned char *d, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | d[i];
    return v;
}

/* n ASCII digits at d, as a number; -1 if any is not a digit. */
static int64_t digits(const unsigned char *d, int n) {
    int64_t x = 0;
    for (int i = 0; i < n; i++) {
        if (d[i] < '0' || d[i] > '9') return -1;
        x = x * 10 + (d[i] - '0');
    }
    return x;
}

/* Days from 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* PostgreSQL's ISO text of a timestamp in years 1..9999, as Unix microseconds; with_tz: it
 * must end in '+00' (the replication session runs with TimeZone=UTC). Anything else (BC,
 * another offset, infinity, a year past 9999) is refused: the converter decides. */
static int parse_timestamp(const unsigned char *d, Py_ssize_t n, int with_tz, int64_t *out) {
    static const int month_days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (with_tz) {
        if (n < 22 || d[n - 3] != '+' || d[n - 2] != '0' || d[n - 1] != '0') return 0;
        n -= 3;
    }
    if (n < 19 || d[4] != '-' || d[7] != '-' || d[10] != ' ' || d[13] != ':' || d[16] != ':')
        return 0;
    int64_t year = digits(d, 4), month = digits(d + 5, 2), day = digits(d + 8, 2);
    int64_t hour = digits(d + 11, 2), minute = digits(d + 14, 2), second = digits(d + 17, 2);
    if (year < 1 || month < 1 || month > 12 || day < 1 || hour < 0 || hour > 23 || minute < 0 ||
        minute > 59 || second < 0 || second > 59)
        return 0;
    int leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    if (day > month_days[month - 1] + (month == 2 && leap)) return 0;
    int64_t micros = 0;
    if (n > 19) {
        Py_ssize_t frac = n - 20;
        if (d[19] != '.' || frac < 1 || frac > 6) return 0;
        micros = digits(d + 20, (int)frac);
        if (micros < 0) return 0;
        for (Py_ssize_t i = frac; i < 6; i++) micros *= 10;
    }
    int64_t seconds = days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second;
    *out = seconds * 1000000 + micros;
    return 1;
}

static status native_value(Out *o, const Plan *plan, const unsigned char *d, Py_ssize_t n) {
    int64_t x;
    switch (plan->op) {
    case OP_TEXT:
        if (!valid_utf8(d, n)) return 0;
        return out_prefixed(o, plan, d, n) < 0 ? -1 : 1;
    case OP_RAW:
        return out_prefixed(o, plan, d, n) < 0 ? -1 : 1;
    case OP_JSONB_BIN:
        if (n < 1 || d[0] != 1) return 0;
        if (!valid_utf8(d + 1, n - 1)) return 0;
        return out_prefixed(o, plan, d + 1, n - 1) < 0 ? -1 : 1;
    case OP_INT_TEXT:
        if (!parse_plain_int(d, n, &x)) return 0;
        return put_int(o, plan, x);
    case OP_INT2_BIN:
        if (n != 2) return 0;
        return put_int(o, plan, (int16_t)be_uint(d, 2));
    case OP_INT4_BIN:
        if (n != 4) return 0;
        return put_int(o, plan, (int32_t)be_uint(d, 4));
    case OP_INT8_BIN:
        if (n != 8) return 0;
        return put_int(o, plan, (int64_t)be_uint(d, 8));
    case OP_OID_BIN:
        if (n != 4) return 0;
        return put_int(o, plan, (int64_t)be_uint(d, 4));
    case OP_BOOL_TEXT:
        if (n != 1 || (d[0] != 't' && d[0] != 'f')) return 0;
        {
            unsigned char b[2] = {2, d[0] == 't'};
            return out_put(o, b, 2) < 0 ? -1 : 1;
        }
    case OP_BOOL_BIN: {
        unsigned char b[2] = {2, !(n == 1 && d[0] == 0)};
        return out_put(o, b, 2) < 0 ? -1 : 1;
    }
    case OP_FLOAT8_BIN: {
        if (n != 8) return 0;
        unsigned char b[9];
        b[0] = 2;
        for (int i = 0; i < 8; i++) b[1 + i] = d[7 - i];
        return out_put(o, b, 9) < 0 ? -1 : 1;
    }
    case OP_NUMERIC_TEXT: {
        if (!parse_scaled(d, n, plan->arg, &x)) return 0;
        /* Python's x.to_bytes(x.bit_length() // 8 + 1, 'big', signed=True) */
        uint64_t magnitude = x < 0 ? (uint64_t)(-x) : (uint64_t)x;
        int bits = 0;
        while (magnitude >> bits) bits++;
        int size = bits / 8 + 1;
        unsigned char b[11];
        b[0] = 2;
        b[1] = (unsigned char)(size << 1); /* size <= 8: one varint byte */
        uint64_t u = (uint64_t)x;
        for (int i = 0; i < size; i++) b[2 + size - 1 - i] = (unsigned char)(u >> (8 * i));
        return out_put(o, b, 2 + size) < 0 ? -1 : 1;
    }
    case OP_TEXT_ARRAY: {
        /* Python's array_text_writer, its common case: one dimension, no quotes, no escapes */
        if (n < 1 || d[0] != '{') return 0;
        if (n == 2 && d[1] == '}') {
            unsigned char b[2] = {2, 0};
            return out_put(o, b, 2) < 0 ? -1 : 1;
        }
        Py_ssize_t braces = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (d[i] == '"' || d[i] == '\\') return 0;
            braces += d[i] == '{';
        }
        if (braces != 1) return 0;
        if (!valid_utf8(d, n)) return 0; /* the items are valid exactly when the whole is */
        const unsigned char delimiter = (unsigned char)plan->arg;
        Py_ssize_t end = n - 1 > 1 ? n - 1 : 1; /* data[1:-1] */
        Py_ssize_t items = 1;
        for (Py_ssize_t i = 1; i < end; i++) items += d[i] == delimiter;
        if (out_put(o, plan->prefix, plan->prefix_len) < 0 || out_long(o, (int64_t)items) < 0)
            return -1;
        Py_ssize_t start = 1;
        for (Py_ssize_t i = 1; i <= end; i++) {
            if (i < end && d[i] != delimiter) continue;
            Py_ssize_t len = i - start;
            if (len == 4 && memcmp(d + start, "NULL", 4) == 0) {
                if (out_put(o, "\0", 1) < 0) return -1;
            } else {
                unsigned char branch = 2;
                if (out_put(o, &branch, 1) < 0 || out_long(o, (int64_t)len) < 0 ||
                    out_put(o, d + start, len) < 0)
                    return -1;
            }
            start = i + 1;
        }
        return out_put(o, "\0", 1) < 0 ? -1 : 1;
    }
    case OP_TIMESTAMPTZ_TEXT:
    case OP_TIMESTAMP_TEXT:
        if (!parse_timestamp(d, n, plan->op == OP_TIMESTAMPTZ_TEXT, &x)) return 0;
        return put_int(o, plan, x);
    default:
        return 0;
    }
}

/* The Python statements for one value: 1 written, 0 refused (a CONVERSION_FAILURE), -1 error. */
static status call_fallback(TupleEncoder *self, Out *o, const Plan *plan, const unsigned char *d,
                            Py_ssize_t n) {
    PyObject *arg = PyBytes_FromStringAndSize((const char *)d, n);
    if (arg == NULL) return -1;
    PyObject *r = PyObject_CallOneArg(plan->fallback, arg);
    Py_DECREF(arg);
    if (r == NULL) {
        if (PyErr_ExceptionMatches(self->failures)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    if (!PyBytes_Check(r)) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "a column fallback returned something other than bytes");
        return -1;
    }
    int rc = out_put(o, PyBytes_AS_STRING(r), PyBytes_GET_SIZE(r));
    Py_DECREF(r);
    return rc < 0 ? -1 : 1;
}

static status encode_value(TupleEncoder *self, Out *o, const Plan *plan, const unsigned char *d,
                           Py_ssize_t n) {
    if (plan->op != OP_CALL) {
        status s = native_value(o, plan, d, n);
        if (s != 0) return s;
    }
    return call_fallback(self, o, plan, d, n);
}

/* The key record's body: the key columns' bytes of the row, in the key's field order; None
 * without a fused key. */
static PyObject *key_bytes(TupleEncoder *self, const Out *o, const Py_ssize_t *bounds) {
    if (self->key_count < 0) return Py_NewRef(Py_None);
    Py_ssize_t size = 0;
    for (Py_ssize_t k = 0; k < self->key_count; k++) {
        Py_ssize_t c = self->key_order[k];
        size += bounds[2 * c + 1] - bounds[2 * c];
    }
    PyObject *key = PyBytes_FromStringAndSize(NULL, size);
    if (key == NULL) return NULL;
    char *p = PyBytes_AS_STRING(key);
    for (Py_ssize_t k = 0; k < self->key_count; k++) {
        Py_ssize_t c = self->key_order[k];
        Py_ssize_t part = bounds[2 * c + 1] - bounds[2 * c];
        memcpy(p, o->data + bounds[2 * c], (size_t)part);
        p += part;
    }
    return key;
}

/* --- the call: (buf, pos) -> (row, unchanged, key or None, end) or None --------------------- */

static PyObject *encode_tuple(TupleEncoder *self, const unsigned char *buf, Py_ssize_t len,
                              Py_ssize_t pos) {
    Out o;
    Py_ssize_t stack_bounds[2 * 16];
    Py_ssize_t *bounds = stack_bounds; /* start, end of each column's bytes in o */
    PyObject *unchanged = NULL, *result = NULL;
    if (self->width > 16) {
        bounds = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)self->width);
        if (bounds == NULL) return PyErr_NoMemory();
    }
    out_init(&o);
    unchanged = PyList_New(0);
    if (unchanged == NULL) goto done;
    if (pos < 0 || pos + 2 > len || (Py_ssize_t)be_uint(buf + pos, 2) != self->width) goto refuse;
    pos += 2;
    for (Py_ssize_t i = 0; i < self->width; i++) {
        const Column *col = &self->columns[i];
        if (pos >= len) goto refuse;
        unsigned char kind = buf[pos];
        bounds[2 * i] = o.len;
        if (kind == 't' || kind == 'b') {
            if (pos + 5 > len) goto refuse;
            Py_ssize_t n = (Py_ssize_t)be_uint(buf + pos + 1, 4);
            Py_ssize_t start = pos + 5;
            if (n > len - start) goto refuse;
            pos = start + n;
            status s = encode_value(self, &o, kind == 't' ? &col->text : &col->binary, buf + start, n);
            if (s < 0) goto done;
            if (s == 0) goto refuse;
        } else if (kind == 'n') {
            pos += 1;
            if (out_put(&o, "\0", 1) < 0) goto done;
        } else if (kind == 'u' && !col->in_key) {
            pos += 1;
            if (out_put(&o, "\0", 1) < 0) goto done; /* a placeholder: listed in unchanged */
            if (PyList_Append(unchanged, col->name) < 0) goto done;
        } else {
            goto refuse; /* an unknown kind, or unchanged TOAST in a key column */
        }
        bounds[2 * i + 1] = o.len;
    }
    {
        PyObject *row = PyBytes_FromStringAndSize((const char *)o.data, o.len);
        if (row == NULL) goto done;
        PyObject *key = key_bytes(self, &o, bounds);
        if (key == NULL) {
            Py_DECREF(row);
            goto done;
        }
        PyObject *end = PyLong_FromSsize_t(pos);
        if (end == NULL) {
            Py_DECREF(row);
            Py_DECREF(key);
            goto done;
        }
        result = PyTuple_New(4);
        if (result == NULL) {
            Py_DECREF(row);
            Py_DECREF(key);
            Py_DECREF(end);
            goto done;
        }
        PyTuple_SET_ITEM(result, 0, row);
        PyTuple_SET_ITEM(result, 1, unchanged);
        unchanged = NULL;
        PyTuple_SET_ITEM(result, 2, key);
        PyTuple_SET_ITEM(result, 3, end);
    }
    goto done;
refuse:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(unchanged);
    out_free(&o);
    if (bounds != stack_bounds) PyMem_Free(bounds);
    return result;
}

static PyObject *TupleEncoder_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                         PyObject *kwnames) {
    TupleEncoder *self = (TupleEncoder *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0)) {
        PyErr_SetString(PyExc_TypeError, "a tuple encoder takes (buf, pos)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *r = encode_tuple(self, view.buf, view.len, pos);
    PyBuffer_Release(&view);
    return r;
}

/* --- construction -------------------------------------------------------------------------- */

static int plan_init(Plan *plan, PyObject *spec) {
    /* (op, prefix bytes, arg, fallback) */
    PyObject *prefix, *fallback;
    if (!PyArg_ParseTuple(spec, "iSiO", &plan->op, &prefix, &plan->arg, &fallback)) return -1;
    if (plan->op < 0 || plan->op > OP_LAST) {
        PyErr_Format(PyExc_ValueError, "unknown operation %d", plan->op);
        return -1;
    }
    if (PyBytes_GET_SIZE(prefix) > (Py_ssize_t)sizeof(plan->prefix)) {
        PyErr_SetString(PyExc_ValueError, "union branch prefix too long");
        return -1;
    }
    if (plan->op == OP_NUMERIC_TEXT && (plan->arg < 0 || plan->arg > 18)) {
        PyErr_SetString(PyExc_ValueError, "numeric scale out of range");
        return -1;
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "a column fallback must be callable");
        return -1;
    }
    plan->prefix_len = PyBytes_GET_SIZE(prefix);
    memcpy(plan->prefix, PyBytes_AS_STRING(prefix), (size_t)plan->prefix_len);
    plan->fallback = Py_NewRef(fallback);
    return 0;
}

static void TupleEncoder_clear_columns(TupleEncoder *self) {
    if (self->columns != NULL) {
        for (Py_ssize_t i = 0; i < self->width; i++) {
            Py_CLEAR(self->columns[i].text.fallback);
            Py_CLEAR(self->columns[i].binary.fallback);
            Py_CLEAR(self->columns[i].name);
        }
        PyMem_Free(self->columns);
        self->columns = NULL;
    }
    PyMem_Free(self->key_order);
    self->key_order = NULL;
}

static void TupleEncoder_dealloc(TupleEncoder *self) {
    PyObject_GC_UnTrack(self);
    TupleEncoder_clear_columns(self);
    Py_CLEAR(self->failures);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int TupleEncoder_traverse(TupleEncoder *self, visitproc visit, void *arg) {
    if (self->columns != NULL) {
        for (Py_ssize_t i = 0; i < self->width; i++) {
            Py_VISIT(self->columns[i].text.fallback);
            Py_VISIT(self->columns[i].binary.fallback);
        }
    }
    Py_VISIT(self->failures);
    return 0;
}

static int TupleEncoder_clear(TupleEncoder *self) {
    TupleEncoder_clear_columns(self);
    Py_CLEAR(self->failures);
    return 0;
}

/* TupleEncoder(columns, key_order, failures): columns is a sequence of
 * (name, in_key, text plan, binary plan); key_order the key columns' positions or None. */
static PyObject *TupleEncoder_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"columns", "key_order", "failures", NULL};
    PyObject *columns, *key_order, *failures;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO!", kwlist, &PyTuple_Type, &columns,
                                     &key_order, &PyTuple_Type, &failures))
        return NULL;
    TupleEncoder *self = (TupleEncoder *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = TupleEncoder_vectorcall;
    self->failures = Py_NewRef(failures);
    self->width = PyTuple_GET_SIZE(columns);
    self->key_count = -1;
    self->columns = PyMem_Calloc((size_t)(self->width ? self->width : 1), sizeof(Column));
    if (self->columns == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < self->width; i++) {
        Column *col = &self->columns[i];
        PyObject *text, *binary, *name;
        int in_key;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(columns, i), "UpO!O!", &name, &in_key,
                              &PyTuple_Type, &text, &PyTuple_Type, &binary))
            goto fail;
        col->name = Py_NewRef(name);
        col->in_key = in_key;
        if (plan_init(&col->text, text) < 0 || plan_init(&col->binary, binary) < 0) goto fail;
    }
    if (key_order != Py_None) {
        if (!PyTuple_Check(key_order)) {
            PyErr_SetString(PyExc_TypeError, "key_order must be a tuple or None");
            goto fail;
        }
        self->key_count = PyTuple_GET_SIZE(key_order);
        self->key_order = PyMem_Calloc((size_t)(self->key_count ? self->key_count : 1),
                                       sizeof(Py_ssize_t));
        if (self->key_order == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t k = 0; k < self->key_count; k++) {
            Py_ssize_t c = PyLong_AsSsize_t(PyTuple_GET_ITEM(key_order, k));
            if (c == -1 && PyErr_Occurred()) goto fail;
            if (c < 0 || c >= self->width || !self->columns[c].in_key) {
                PyErr_SetString(PyExc_ValueError, "a key position that is not a key column");
                goto fail;
            }
            self->key_order[k] = c;
        }
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static PyObject *TupleEncoder_get_width(TupleEncoder *self, void *closure) {
    return PyLong_FromSsize_t(self->width);
}

static PyObject *TupleEncoder_get_ops(TupleEncoder *self, void *closure) {
    PyObject *ops = PyTuple_New(self->width);
    if (ops == NULL) return NULL;
    for (Py_ssize_t i = 0; i < self->width; i++) {
        PyObject *pair = Py_BuildValue("(ii)", self->columns[i].text.op, self->columns[i].binary.op);
        if (pair == NULL) {
            Py_DECREF(ops);
            return NULL;
        }
        PyTuple_SET_ITEM(ops, i, pair);
    }
    return ops;
}

static PyGetSetDef TupleEncoder_getset[] = {
    {"width", (getter)TupleEncoder_get_width, NULL, "the table's column count", NULL},
    {"ops", (getter)TupleEncoder_get_ops, NULL, "each column's (text, binary) operation", NULL},
    {NULL},
};

static PyMethodDef TupleEncoder_methods[];

static PyTypeObject TupleEncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "schemas._wire_native.TupleEncoder",
    .tp_doc = PyDoc_STR("(pgoutput payload, TupleData offset) -> (row body, unchanged TOAST "
                        "names, key body or None, end offset), or None to take the careful path"),
    .tp_basicsize = sizeof(TupleEncoder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = TupleEncoder_new,
    .tp_dealloc = (destructor)TupleEncoder_dealloc,
    .tp_traverse = (traverseproc)TupleEncoder_traverse,
    .tp_clear = (inquiry)TupleEncoder_clear,
    .tp_vectorcall_offset = offsetof(TupleEncoder, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_getset = TupleEncoder_getset,
    .tp_methods = TupleEncoder_methods,
};
/* --- COPY text rows: (line) -> (row body, key body or None) or None ----------------------- */

/* The same plans read one row of COPY ... TO STDOUT text (no newline). A line holding a
 * backslash (NULL as \N, or an escape) goes to `slow`, the generated Python COPY twin, which
 * applies the COPY text rules' one home (producer.snapshot.copy_text); a backslash-free line's
 * fields are the values' text as they are, each encoded as a streamed text value. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    TupleEncoder *plans;
    PyObject *slow;
} CopyEncoder;

static PyObject *encode_copy_line(CopyEncoder *self, PyObject *line) {
    TupleEncoder *plans = self->plans;
    char *data;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(line, &data, &len) < 0) return NULL;
    const unsigned char *buf = (const unsigned char *)data;
    if (memchr(buf, '\\', (size_t)len) != NULL) return PyObject_CallOneArg(self->slow, line);
    if (plans->width == 0) return Py_NewRef(Py_None); /* one (empty) field, no column */
    Out o;
    Py_ssize_t stack_bounds[2 * 16];
    Py_ssize_t *bounds = stack_bounds;
    PyObject *result = NULL;
    if (plans->width > 16) {
        bounds = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)plans->width);
        if (bounds == NULL) return PyErr_NoMemory();
    }
    out_init(&o);
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i < plans->width; i++) {
        if (start > len) goto refuse; /* fewer fields than columns */
        const unsigned char *tab = memchr(buf + start, '\t', (size_t)(len - start));
        Py_ssize_t end = tab != NULL ? tab - buf : len;
        if ((i == plans->width - 1) != (tab == NULL)) goto refuse; /* a field count other than the width */
        bounds[2 * i] = o.len;
        status st = encode_value(plans, &o, &plans->columns[i].text, buf + start, end - start);
        if (st < 0) goto done;
        if (st == 0) goto refuse;
        bounds[2 * i + 1] = o.len;
        start = end + 1;
    }
    {
        PyObject *row = PyBytes_FromStringAndSize((const char *)o.data, o.len);
        if (row == NULL) goto done;
        PyObject *key = key_bytes(plans, &o, bounds);
        if (key == NULL) {
            Py_DECREF(row);
            goto done;
        }
        result = PyTuple_Pack(2, row, key);
        Py_DECREF(row);
        Py_DECREF(key);
    }
    goto done;
refuse:
    result = Py_NewRef(Py_None);
done:
    out_free(&o);
    if (bounds != stack_bounds) PyMem_Free(bounds);
    return result;
}

static PyObject *CopyEncoder_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0)) {
        PyErr_SetString(PyExc_TypeError, "a COPY row encoder takes (line)");
        return NULL;
    }
    return encode_copy_line((CopyEncoder *)callable, args[0]);
}

static void CopyEncoder_dealloc(CopyEncoder *self) {
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->plans);
    Py_CLEAR(self->slow);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int CopyEncoder_traverse(CopyEncoder *self, visitproc visit, void *arg) {
    Py_VISIT(self->plans);
    Py_VISIT(self->slow);
    return 0;
}

static int CopyEncoder_clear(CopyEncoder *self) {
    Py_CLEAR(self->plans);
    Py_CLEAR(self->slow);
    return 0;
}

static PyTypeObject CopyEncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "schemas._wire_native.CopyEncoder",
    .tp_doc = PyDoc_STR("(one COPY text row) -> (row body, key body or None), or None to take "
                        "the careful path"),
    .tp_basicsize = sizeof(CopyEncoder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_dealloc = (destructor)CopyEncoder_dealloc,
    .tp_traverse = (traverseproc)CopyEncoder_traverse,
    .tp_clear = (inquiry)CopyEncoder_clear,
    .tp_vectorcall_offset = offsetof(CopyEncoder, vectorcall),
    .tp_call = PyVectorcall_Call,
};

static PyObject *TupleEncoder_copy_twin(TupleEncoder *self, PyObject *slow) {
    if (!PyCallable_Check(slow)) {
        PyErr_SetString(PyExc_TypeError, "copy_twin takes the Python COPY twin (a callable)");
        return NULL;
    }
    CopyEncoder *twin = PyObject_GC_New(CopyEncoder, &CopyEncoderType);
    if (twin == NULL) return NULL;
    twin->vectorcall = CopyEncoder_vectorcall;
    twin->plans = (TupleEncoder *)Py_NewRef(self);
    twin->slow = Py_NewRef(slow);
    PyObject_GC_Track(twin);
    return (PyObject *)twin;
}

static PyMethodDef TupleEncoder_methods[] = {
    {"copy_twin", (PyCFunction)TupleEncoder_copy_twin, METH_O,
     PyDoc_STR("copy_twin(slow) -> the COPY text row encoder with these plans; lines holding a "
               "backslash go to slow(line)")},
    {NULL},
};


static struct PyModuleDef wire_native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "schemas._wire_native",
    .m_doc = PyDoc_STR("The compiled TupleData -> Avro row encoder (see schemas.native_encoder)."),
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__wire_native(void) {
    if (PyType_Ready(&TupleEncoderType) < 0 || PyType_Ready(&CopyEncoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&wire_native_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "TupleEncoder", (PyObject *)&TupleEncoderType) < 0 ||
        PyModule_AddIntConstant(m, "OP_CALL", OP_CALL) < 0 ||
        PyModule_AddIntConstant(m, "OP_TEXT", OP_TEXT) < 0 ||
        PyModule_AddIntConstant(m, "OP_RAW", OP_RAW) < 0 ||
        PyModule_AddIntConstant(m, "OP_JSONB_BIN", OP_JSONB_BIN) < 0 ||
        PyModule_AddIntConstant(m, "OP_INT_TEXT", OP_INT_TEXT) < 0 ||
        PyModule_AddIntConstant(m, "OP_INT2_BIN", OP_INT2_BIN) < 0 ||
        PyModule_AddIntConstant(m, "OP_INT4_BIN", OP_INT4_BIN) < 0 ||
        PyModule_AddIntConstant(m, "OP_INT8_BIN", OP_INT8_BIN) < 0 ||
        PyModule_AddIntConstant(m, "OP_OID_BIN", OP_OID_BIN) < 0 ||
        PyModule_AddIntConstant(m, "OP_BOOL_TEXT", OP_BOOL_TEXT) < 0 ||
        PyModule_AddIntConstant(m, "OP_BOOL_BIN", OP_BOOL_BIN) < 0 ||
        PyModule_AddIntConstant(m, "OP_FLOAT8_BIN", OP_FLOAT8_BIN) < 0 ||
        PyModule_AddIntConstant(m, "OP_NUMERIC_TEXT", OP_NUMERIC_TEXT) < 0 ||
        PyModule_AddIntConstant(m, "OP_TEXT_ARRAY", OP_TEXT_ARRAY) < 0 ||
        PyModule_AddIntConstant(m, "OP_TIMESTAMPTZ_TEXT", OP_TIMESTAMPTZ_TEXT) < 0 ||
        PyModule_AddIntConstant(m, "OP_TIMESTAMP_TEXT", OP_TIMESTAMP_TEXT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
