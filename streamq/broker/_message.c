/* streamq.broker._message: the broker's per-message record, StoredMessage, in C.
 *
 * See MODULE_DOC below for what this type owns and why it is C. `tests/unit/broker/
 * test_message.py` checks it: fields, type checks, subclassing by PagedMessage, and that
 * the collector does not track it.
 *
 * Build by hand (setup.py builds it for installs), from the repository root:
 *   gcc -O2 -Wall -Wextra -Werror -shared -fPIC -I<python include dir> \
 *       streamq/broker/_message.c -o streamq/broker/_message$(python3-config --extension-suffix)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stddef.h>

PyDoc_STRVAR(MODULE_DOC,
"StoredMessage, the broker's record of one routed message, as a C type the cyclic\n"
"garbage collector does not track.\n"
"\n"
"A broker holds one StoredMessage per queued message. As a Python class with __slots__\n"
"each was tracked by CPython's collector, so every older collection walked all of them:\n"
"with a million messages queued a full collection held the event loop for 200-580 ms,\n"
"and a middle one for 30-66 ms (streamq serve under benchmarks/compare.py, 2026-11-24;\n"
"docs/perf.md, \"Collector pauses\"). Its fields can hold only str and bytes objects and\n"
"integers, which refer to nothing, so a StoredMessage can never be part of a reference\n"
"cycle and the collector has nothing to find in it: this type leaves it out. Construction\n"
"checks those types, the str and bytes fields are read-only after it, and the integer\n"
"fields take only integers: that is what keeps it true.\n"
"\n"
"It must not hold any other kind of object. A subclass (paging.PagedMessage) may add\n"
"slots; CPython then tracks the subclass's instances as usual.\n");

PyDoc_STRVAR(STORED_MESSAGE_DOC,
"StoredMessage(offset, exchange, routing_key, properties_raw, body, refs, timestamp_ms=0)\n"
"--\n"
"\n"
"A routed message's contents, shared by every queue it went to (`refs` of them).\n"
"\n"
"offset, refs and timestamp_ms (when it was published; TTLs count from here) are\n"
"integers of 64 bits; exchange and routing_key are str; properties_raw and body bytes,\n"
"read-only. Anything else raises TypeError.");

typedef struct {
    PyObject_HEAD
    PyObject *exchange;       /* str */
    PyObject *routing_key;    /* str */
    PyObject *properties_raw; /* bytes */
    PyObject *body;           /* bytes */
    long long offset;
    long long timestamp_ms;
    long long refs;
} StoredMessage;

/* The positional arguments: offset, exchange, routing_key, properties_raw, body, refs and
 * the optional timestamp_ms. */
#define ARGS_MIN 6
#define ARGS_MAX 7

static PyTypeObject StoredMessageType;

/* Stores `value` (a new reference is taken) into `*slot` when it is of the exact type
 * `wanted`; else raises TypeError naming `field`. Subclasses of str and bytes are refused:
 * they can carry attributes, and so references, that this untracked type must not hold. */
static int
set_exact(PyObject **slot, PyObject *value, PyTypeObject *wanted, const char *field)
{
    if (Py_TYPE(value) != wanted) {
        PyErr_Format(PyExc_TypeError, "StoredMessage.%s must be %s, not %.200s", field,
                     wanted->tp_name, Py_TYPE(value)->tp_name);
        return -1;
    }
    Py_INCREF(value);
    Py_XSETREF(*slot, value);
    return 0;
}

static int
set_integer(long long *slot, PyObject *value, const char *field)
{
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "StoredMessage.%s must be int, not %.200s", field,
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    long long number = PyLong_AsLongLong(value);
    if (number == -1 && PyErr_Occurred()) {
        return -1;
    }
    *slot = number;
    return 0;
}

/* All seven fields from `args` (ARGS_MIN or ARGS_MAX of them, checked by the caller). */
static int
fill(StoredMessage *self, PyObject *const *args, Py_ssize_t count)
{
    if (set_integer(&self->offset, args[0], "offset") < 0 ||
        set_exact(&self->exchange, args[1], &PyUnicode_Type, "exchange") < 0 ||
        set_exact(&self->routing_key, args[2], &PyUnicode_Type, "routing_key") < 0 ||
        set_exact(&self->properties_raw, args[3], &PyBytes_Type, "properties_raw") < 0 ||
        set_exact(&self->body, args[4], &PyBytes_Type, "body") < 0 ||
        set_integer(&self->refs, args[5], "refs") < 0) {
        return -1;
    }
    self->timestamp_ms = 0;
    if (count == ARGS_MAX && set_integer(&self->timestamp_ms, args[6], "timestamp_ms") < 0) {
        return -1;
    }
    return 0;
}

static void
message_dealloc(StoredMessage *self)
{
    Py_CLEAR(self->exchange);
    Py_CLEAR(self->routing_key);
    Py_CLEAR(self->properties_raw);
    Py_CLEAR(self->body);
    /* A subclass's instance comes here through subtype_dealloc, which untracks it before
     * and releases its reference to the heap type after. */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* __init__ for calls that do not take the fast path (keywords, or through a subclass
 * that does not define its own __init__). */
static int
message_init(StoredMessage *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"offset", "exchange", "routing_key", "properties_raw",
                               "body", "refs", "timestamp_ms", NULL};
    PyObject *values[ARGS_MAX] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO|O:StoredMessage", keywords,
                                     &values[0], &values[1], &values[2], &values[3],
                                     &values[4], &values[5], &values[6])) {
        return -1;
    }
    return fill(self, values, values[6] == NULL ? ARGS_MIN : ARGS_MAX);
}

/* StoredMessage(...) itself, positional arguments only: the per-message path. Other calls
 * (keywords, a subclass) go through type.__call__, that is tp_new and tp_init. */
static PyObject *
message_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t count = PyVectorcall_NARGS(nargsf);
    if (type != (PyObject *)&StoredMessageType || kwnames != NULL || count < ARGS_MIN ||
        count > ARGS_MAX) {
        PyObject *tuple = PyTuple_New(count);
        if (tuple == NULL) {
            return NULL;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_INCREF(args[i]);
            PyTuple_SET_ITEM(tuple, i, args[i]);
        }
        PyObject *kwargs = NULL;
        if (kwnames != NULL) {
            kwargs = PyDict_New();
            if (kwargs == NULL) {
                Py_DECREF(tuple);
                return NULL;
            }
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
                if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[count + i]) <
                    0) {
                    Py_DECREF(kwargs);
                    Py_DECREF(tuple);
                    return NULL;
                }
            }
        }
        PyObject *made = PyType_Type.tp_call(type, tuple, kwargs);
        Py_XDECREF(kwargs);
        Py_DECREF(tuple);
        return made;
    }
    StoredMessage *self = PyObject_New(StoredMessage, &StoredMessageType);
    if (self == NULL) {
        return NULL;
    }
    self->exchange = self->routing_key = self->properties_raw = self->body = NULL;
    if (fill(self, args, count) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* The str and bytes fields are members, not getters: CPython 3.11 specializes the read of
 * a T_OBJECT_EX member to a load at a fixed offset (LOAD_ATTR_SLOT), as fast as a
 * Python class's __slots__ and 4 times faster than a getter (docs/perf.md, "Collector
 * pauses"). They are read-only, so no store can bypass the type checks of construction. */
static PyMemberDef message_members[] = {
    {"exchange", T_OBJECT_EX, offsetof(StoredMessage, exchange), READONLY,
     "The exchange it was published to (str)."},
    {"routing_key", T_OBJECT_EX, offsetof(StoredMessage, routing_key), READONLY,
     "Its routing key (str)."},
    {"properties_raw", T_OBJECT_EX, offsetof(StoredMessage, properties_raw), READONLY,
     "Its encoded content-header properties (bytes)."},
    {"body", T_OBJECT_EX, offsetof(StoredMessage, body), READONLY, "Its body (bytes)."},
    {NULL, 0, 0, 0, NULL},
};

/* The integers go through getters and setters of their own: a T_LONGLONG member would do,
 * but CPython's PyMember_SetOne stores -1 before it finds a value that is not an integer
 * (tests/unit/broker/test_message.py caught it), and `refs` must never change that way. */
#define INTEGER_FIELD(name)                                                             \
    static PyObject *get_##name(StoredMessage *self, void *Py_UNUSED(closure))          \
    {                                                                                   \
        return PyLong_FromLongLong(self->name);                                         \
    }                                                                                   \
    static int set_##name(StoredMessage *self, PyObject *value, void *Py_UNUSED(closure)) \
    {                                                                                   \
        if (value == NULL) {                                                            \
            PyErr_SetString(PyExc_TypeError, "cannot delete StoredMessage." #name);     \
            return -1;                                                                  \
        }                                                                               \
        return set_integer(&self->name, value, #name);                                  \
    }

INTEGER_FIELD(offset)
INTEGER_FIELD(timestamp_ms)
INTEGER_FIELD(refs)

#define GETSET(name, doc) {#name, (getter)get_##name, (setter)set_##name, doc, NULL}

static PyGetSetDef message_getset[] = {
    GETSET(offset, "The message's offset in its vhost's message log."),
    GETSET(refs, "How many queues still hold it."),
    GETSET(timestamp_ms, "When it was published, in ms since the Unix epoch."),
    {NULL, NULL, NULL, NULL, NULL},
};

/* refs -= 1 and the result, in one call: the settle path's use of `refs`. */
static PyObject *
message_release(StoredMessage *self, PyObject *Py_UNUSED(ignored))
{
    self->refs -= 1;
    return PyLong_FromLongLong(self->refs);
}

static PyMethodDef message_methods[] = {
    {"release", (PyCFunction)message_release, METH_NOARGS,
     "One queue is done with the message: `refs` goes down by one; returns what is left."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StoredMessageType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamq.broker._message.StoredMessage",
    .tp_doc = STORED_MESSAGE_DOC,
    .tp_basicsize = sizeof(StoredMessage),
    .tp_itemsize = 0,
    /* No Py_TPFLAGS_HAVE_GC: the point of this type (see MODULE_DOC). */
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)message_init,
    .tp_dealloc = (destructor)message_dealloc,
    .tp_members = message_members,
    .tp_getset = message_getset,
    .tp_methods = message_methods,
    .tp_vectorcall = message_vectorcall,
};

static int
message_exec(PyObject *module)
{
    if (PyType_Ready(&StoredMessageType) < 0) {
        return -1;
    }
    Py_INCREF(&StoredMessageType);
    if (PyModule_AddObject(module, "StoredMessage", (PyObject *)&StoredMessageType) < 0) {
        Py_DECREF(&StoredMessageType);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot message_slots[] = {
    {Py_mod_exec, message_exec},
    {0, NULL},
};

static struct PyModuleDef message_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "streamq.broker._message",
    .m_doc = MODULE_DOC,
    .m_size = 0,
    .m_slots = message_slots,
};

PyMODINIT_FUNC
PyInit__message(void)
{
    return PyModuleDef_Init(&message_module);
}
