/* The relay's per-token rule, compiled: scan_event(data, start, stop) and scan_chunk(data) of
 * event_scan.py, the same answers for every input (tests/serving/test_event_scan.py checks the two against each
 * other). event_scan.py holds the rule's description and its reference; change both together.
 * Built by `pip install` when a C compiler is there (optional: without one the package uses
 * the Python reference). */
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem (POSIX.1-2024; glibc, musl and the BSDs have it) */
#endif
#include <Python.h>
#include <string.h>

/* First i in [lo, hi - n] where s[i:i+n] == pat, else -1 (bytes.find(pat, lo, hi)). */
static Py_ssize_t find(const char *s, Py_ssize_t lo, Py_ssize_t hi, const char *pat, Py_ssize_t n)
{
    if (hi - lo < n)
        return -1;
    const char *p = memmem(s + lo, (size_t)(hi - lo), pat, (size_t)n);
    return p == NULL ? -1 : p - s;
}

/* Last i in [lo, hi - n] where s[i:i+n] == pat, else -1 (bytes.rfind(pat, lo, hi)). */
static Py_ssize_t rfind(const char *s, Py_ssize_t lo, Py_ssize_t hi, const char *pat, Py_ssize_t n)
{
    for (Py_ssize_t i = hi - n; i >= lo; i--)
        if (s[i] == pat[0] && memcmp(s + i, pat, (size_t)n) == 0)
            return i;
    return -1;
}

/* The rule on s[start:stop] (len bytes in all): 1 with *done (a new reference), *at and
 * *finished set; 0 for the general path; -1 with an exception set. */
static int scan(const char *s, Py_ssize_t len, Py_ssize_t start, Py_ssize_t stop,
                PyObject **done_out, Py_ssize_t *at_out, int *finished_out)
{
    if (start < 0 || stop > len || stop - start < 9)
        return 0;
    Py_ssize_t end = stop - 2; /* the usage object's closing brace */
    if (memcmp(s + start, "data: {", 7) != 0 || s[end] != '}' || s[end + 1] != '}')
        return 0;
    /* what sends the event to the general path: CR, LF, [], "error", recomputed */
    size_t n = (size_t)(stop - start);
    const char *e = s + start;
    if (memchr(e, '\r', n) != NULL || memchr(e, '\n', n) != NULL
            || memmem(e, n, "\"error\"", 7) != NULL || memmem(e, n, "recomputed", 10) != NULL)
        return 0;
    for (const char *b = memchr(e, '[', n); b != NULL; b = memchr(b + 1, '[', (size_t)(s + stop - b - 1)))
        if (b[1] == ']') /* b + 1 < s + len: s[stop - 1] is '}' */
            return 0;
    Py_ssize_t at = rfind(s, start, end, ",\"usage\":{", 10);
    if (at < 0 || memchr(s + at + 10, '{', (size_t)(end - at - 10)) != NULL
            || memchr(s + at + 10, '}', (size_t)(end - at - 10)) != NULL)
        return 0;
    Py_ssize_t c = find(s, at, end, "\"completion_tokens\":", 20);
    Py_ssize_t f = find(s, start, at, "\"finish_reason\":", 16);
    if (c < 0 || (f >= 0 && ((s[f - 1] != ',' && s[f - 1] != '{') || (s[f + 16] != 'n' && s[f + 16] != '"'))))
        return 0;
    Py_ssize_t lo = c + 20;
    const char *comma = memchr(s + lo, ',', (size_t)(end - lo));
    Py_ssize_t hi = comma != NULL ? comma - s : end;
    PyObject *done = NULL;
    if (hi - lo >= 1 && hi - lo <= 18) { /* plain digits: no overflow in 18 */
        long long value = 0;
        Py_ssize_t i = lo;
        for (; i < hi && s[i] >= '0' && s[i] <= '9'; i++)
            value = value * 10 + (s[i] - '0');
        if (i == hi)
            done = PyLong_FromLongLong(value);
    }
    if (done == NULL) { /* anything else as int() reads it (signs, spaces, underscores, ...) */
        PyObject *text = PyBytes_FromStringAndSize(s + lo, hi - lo);
        if (text == NULL)
            return -1;
        done = PyObject_CallOneArg((PyObject *)&PyLong_Type, text);
        Py_DECREF(text);
        if (done == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_ValueError))
                return -1;
            PyErr_Clear();
            return 0;
        }
    }
    *done_out = done;
    *at_out = at;
    *finished_out = f >= 0 && s[f + 16] == '"';
    return 1;
}

/* (prefix..., done, at, finished) as a new tuple from scan's outputs (steals done). */
static PyObject *pack(Py_ssize_t n, Py_ssize_t start, PyObject *done, Py_ssize_t at, int finished)
{
    PyObject *out = PyTuple_New(n);
    PyObject *where = PyLong_FromSsize_t(at);
    PyObject *first = n == 4 ? PyLong_FromSsize_t(start) : NULL;
    if (out == NULL || where == NULL || (n == 4 && first == NULL)) {
        Py_XDECREF(out);
        Py_XDECREF(where);
        Py_XDECREF(first);
        Py_DECREF(done);
        return NULL;
    }
    Py_ssize_t i = 0;
    if (n == 4)
        PyTuple_SET_ITEM(out, i++, first);
    PyTuple_SET_ITEM(out, i++, done);
    PyTuple_SET_ITEM(out, i++, where);
    PyObject *flag = finished ? Py_True : Py_False;
    Py_INCREF(flag);
    PyTuple_SET_ITEM(out, i, flag);
    return out;
}

static PyObject *scan_event(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "scan_event(data, start, stop) takes 3 arguments");
        return NULL;
    }
    if (!PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "scan_event: data must be bytes");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t stop = PyLong_AsSsize_t(args[2]);
    if (stop == -1 && PyErr_Occurred())
        return NULL;
    PyObject *done;
    Py_ssize_t at;
    int finished;
    int hit = scan(PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), start, stop, &done, &at, &finished);
    if (hit < 0)
        return NULL;
    if (hit == 0)
        Py_RETURN_NONE;
    return pack(3, 0, done, at, finished);
}

/* scan_chunk(data) of event_scan.py: data is exactly one whole chunk in the servers' form (a
 * size line of lower-case hex without leading zeros, CRLF, the payload, CRLF; http1.whole_chunk)
 * whose payload ends in a blank line, and the rule takes the event before it. */
static PyObject *scan_chunk(PyObject *module, PyObject *data)
{
    (void)module;
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "scan_chunk: data must be bytes");
        return NULL;
    }
    const char *s = PyBytes_AS_STRING(data);
    Py_ssize_t len = PyBytes_GET_SIZE(data);
    Py_ssize_t eol = find(s, 0, len < 18 ? len : 18, "\r\n", 2);
    Py_ssize_t size = len - eol - 4;
    if (eol <= 0 || size <= 0 || s[len - 2] != '\r' || s[len - 1] != '\n')
        Py_RETURN_NONE;
    /* the size line: lower-case hex of size, no leading zero (eol digits, the first non-zero) */
    if (s[0] == '0')
        Py_RETURN_NONE;
    size_t value = 0;
    for (Py_ssize_t i = 0; i < eol; i++) {
        char ch = s[i];
        unsigned digit;
        if (ch >= '0' && ch <= '9')
            digit = (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f')
            digit = (unsigned)(ch - 'a' + 10);
        else
            Py_RETURN_NONE;
        value = value * 16 + digit; /* eol <= 16 digits: no overflow of 64 bits */
    }
    if (value != (size_t)size || size < 2 || s[len - 4] != '\n' || s[len - 3] != '\n')
        Py_RETURN_NONE;
    PyObject *done;
    Py_ssize_t at;
    int finished;
    int hit = scan(s, len, eol + 2, len - 4, &done, &at, &finished);
    if (hit < 0)
        return NULL;
    if (hit == 0)
        Py_RETURN_NONE;
    return pack(4, eol + 2, done, at, finished);
}

static PyMethodDef methods[] = {
    {"scan_event", (PyCFunction)(void (*)(void))scan_event, METH_FASTCALL,
     "scan_event(data, start, stop) -> (completion_tokens, at, finished) | None"},
    {"scan_chunk", (PyCFunction)scan_chunk, METH_O,
     "scan_chunk(data) -> (start, completion_tokens, at, finished) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_event_scan", "The relay's per-token rule, compiled (event_scan.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__event_scan(void)
{
    return PyModule_Create(&module);
}
