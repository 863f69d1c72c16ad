/* The relay's per-token rule, compiled: scan_event(data, start, stop) of event_scan.py, the
 * same answer for every input (tests/serving/test_event_scan.py checks the two against each
 * other). event_scan.py holds the rule's description and its reference; change both together.
 * Built by `pip install` when a C compiler is there (optional: without one the package uses
 * the Python reference). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* First i in [lo, hi - n] where s[i:i+n] == pat, else -1 (bytes.find(pat, lo, hi)). */
static Py_ssize_t find(const char *s, Py_ssize_t lo, Py_ssize_t hi, const char *pat, Py_ssize_t n)
{
    if (hi - lo < n)
        return -1;
    const char *p = s + lo, *last = s + hi - n;
    while (p <= last) {
        p = memchr(p, pat[0], (size_t)(last - p + 1));
        if (p == NULL)
            return -1;
        if (memcmp(p, pat, (size_t)n) == 0)
            return p - s;
        p++;
    }
    return -1;
}

/* Last i in [lo, hi - n] where s[i:i+n] == pat, else -1 (bytes.rfind(pat, lo, hi)). */
static Py_ssize_t rfind(const char *s, Py_ssize_t lo, Py_ssize_t hi, const char *pat, Py_ssize_t n)
{
    for (Py_ssize_t i = hi - n; i >= lo; i--)
        if (s[i] == pat[0] && memcmp(s + i, pat, (size_t)n) == 0)
            return i;
    return -1;
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
    const char *s = PyBytes_AS_STRING(args[0]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    if (start < 0 || stop > len || stop - start < 9)
        Py_RETURN_NONE;
    Py_ssize_t end = stop - 2; /* the usage object's closing brace */
    if (memcmp(s + start, "data: {", 7) != 0 || s[end] != '}' || s[end + 1] != '}')
        Py_RETURN_NONE;
    /* one pass for what sends the event to the general path: CR, LF, [], "error", recomputed
     * (a table picks out the few bytes that can start one) */
    static const unsigned char starts[256] = {['\r'] = 1, ['\n'] = 1, ['['] = 1, ['"'] = 1, ['r'] = 1};
    const unsigned char *u = (const unsigned char *)s;
    for (Py_ssize_t i = start; i < stop; i++) {
        if (!starts[u[i]])
            continue;
        switch (s[i]) {
        case '\r':
        case '\n':
            Py_RETURN_NONE;
        case '[':
            if (s[i + 1] == ']') /* i + 1 < len: s[stop - 1] is '}' */
                Py_RETURN_NONE;
            break;
        case '"':
            if (s[i + 1] == 'e' && i + 7 <= stop && memcmp(s + i, "\"error\"", 7) == 0)
                Py_RETURN_NONE;
            break;
        default: /* 'r' */
            if (s[i + 1] == 'e' && i + 10 <= stop && memcmp(s + i, "recomputed", 10) == 0)
                Py_RETURN_NONE;
            break;
        }
    }
    Py_ssize_t at = rfind(s, start, end, ",\"usage\":{", 10);
    if (at < 0 || memchr(s + at + 10, '{', (size_t)(end - at - 10)) != NULL
            || memchr(s + at + 10, '}', (size_t)(end - at - 10)) != NULL)
        Py_RETURN_NONE;
    Py_ssize_t c = find(s, at, end, "\"completion_tokens\":", 20);
    Py_ssize_t f = find(s, start, at, "\"finish_reason\":", 16);
    if (c < 0 || (f >= 0 && ((s[f - 1] != ',' && s[f - 1] != '{') || (s[f + 16] != 'n' && s[f + 16] != '"'))))
        Py_RETURN_NONE;
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
            return NULL;
        done = PyObject_CallOneArg((PyObject *)&PyLong_Type, text);
        Py_DECREF(text);
        if (done == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_ValueError))
                return NULL;
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    }
    PyObject *where = PyLong_FromSsize_t(at);
    if (where == NULL) {
        Py_DECREF(done);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(3, done, where, (f >= 0 && s[f + 16] == '"') ? Py_True : Py_False);
    Py_DECREF(done);
    Py_DECREF(where);
    return out;
}

static PyMethodDef methods[] = {
    {"scan_event", (PyCFunction)(void (*)(void))scan_event, METH_FASTCALL,
     "scan_event(data, start, stop) -> (completion_tokens, at, finished) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_event_scan", "The relay's per-token rule, compiled (event_scan.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__event_scan(void)
{
    return PyModule_Create(&module);
}
