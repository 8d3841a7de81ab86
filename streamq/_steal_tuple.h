/*
 * `steal_tuple`, shared by the gateways' C scanners (amqp_gateway/codec/_scan*.c and
 * mqtt_gateway/codec/_scan.c): a tuple of `count` new references, which it steals in
 * every case; NULL with MemoryError if one of them is NULL or the tuple cannot be made
 * (the reference that failed left its exception). Include after <Python.h>.
 */
#ifndef STREAMQ_STEAL_TUPLE_H
#define STREAMQ_STEAL_TUPLE_H

static inline PyObject *
steal_tuple(PyObject **items, Py_ssize_t count)
{
    PyObject *tuple = PyTuple_New(count);
    int complete = tuple != NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        complete = complete && items[i] != NULL;
    }
    if (!complete) {
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_XDECREF(items[i]);
        }
        Py_XDECREF(tuple);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyTuple_SET_ITEM(tuple, i, items[i]);
    }
    return tuple;
}

#endif /* STREAMQ_STEAL_TUPLE_H */
