/* The per-allocation calls of kmm.numba, compiled.
 *
 * Numba allocates through its memory-manager plugin at every numba.cuda.device_array, so the
 * plugin's cost is paid per array. Through ctypes, one call into libkmm costs several times what
 * libkmm spends in it (an argument-conversion object per argument, then libffi), and the
 * Python objects that free an allocation when Numba drops it cost as much again. This module
 * makes the same two calls from C and frees from tp_dealloc, with no Python frame on either path.
 *
 * It calls the libkmm that kmm._lib loaded, through the function addresses given to bind(), so
 * a process has one libkmm and one handle registry whichever way libkmm was found.
 * kmm/_plugin_calls_py.py is the same interface in Python (ctypes), used when this module was not
 * built; tests/test_plugin_calls.py runs the same checks on both.
 *
 * Everything here runs with the GIL held, which is what serializes a Deferral's list.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

/* kmm_plugin_alloc and kmm_plugin_free of gen/kmm.h (KmmManager and KmmBuffer are uint64_t,
 * KmmStatus is uint32_t): by buffer handle, so libkmm keeps no table by address for them. */
typedef uint32_t (*plugin_alloc_fn)(uint64_t manager, uint64_t bytes, uint32_t kind, uint64_t stream,
                                    uint64_t *buffer, uint64_t *address);
typedef uint32_t (*plugin_free_fn)(uint64_t manager, uint64_t buffer, uint64_t stream);

#define KMM_OK 0
#define KMM_MEMORY_DEVICE 0

static plugin_alloc_fn plugin_alloc;
static plugin_free_fn plugin_free;
static PyObject *DeferralType;
static PyObject *AllocationType;

/* ------------------------------------------------------------------------------------------ */
/* Deferral: while entered, the frees of its allocations wait in a list (Numba's defer_cleanup). */

typedef struct {
    uint64_t manager, buffer, stream;
} PendingFree;

typedef struct {
    PyObject_HEAD
    Py_ssize_t depth;
    PendingFree *pending;
    Py_ssize_t len, cap;
} Deferral;

/* Frees everything pending, now; returns how many. */
static Py_ssize_t deferral_flush_all(Deferral *d)
{
    Py_ssize_t n = d->len;
    d->len = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        plugin_free(d->pending[i].manager, d->pending[i].buffer, d->pending[i].stream);
    return n;
}

/* Queues a free; 0 when there is no memory for the entry (the caller then frees at once). */
static int deferral_push(Deferral *d, uint64_t manager, uint64_t buffer, uint64_t stream)
{
    if (d->len == d->cap) {
        Py_ssize_t cap = d->cap ? 2 * d->cap : 16;
        PendingFree *grown = realloc(d->pending, (size_t)cap * sizeof(PendingFree));
        if (!grown)
            return 0;
        d->pending = grown;
        d->cap = cap;
    }
    d->pending[d->len].manager = manager;
    d->pending[d->len].buffer = buffer;
    d->pending[d->len].stream = stream;
    d->len++;
    return 1;
}

static PyObject *deferral_enter(PyObject *self, PyObject *unused)
{
    ((Deferral *)self)->depth++;
    Py_RETURN_NONE;
}

static PyObject *deferral_exit(PyObject *self, PyObject *unused)
{
    Deferral *d = (Deferral *)self;
    if (d->depth == 0) {
        PyErr_SetString(PyExc_RuntimeError, "Deferral.exit() without a matching enter()");
        return NULL;
    }
    if (--d->depth == 0)
        deferral_flush_all(d);
    Py_RETURN_NONE;
}

static PyObject *deferral_flush(PyObject *self, PyObject *unused)
{
    return PyLong_FromSsize_t(deferral_flush_all((Deferral *)self));
}

static PyObject *deferral_discard(PyObject *self, PyObject *unused)
{
    ((Deferral *)self)->len = 0;
    Py_RETURN_NONE;
}

static PyObject *deferral_get_depth(PyObject *self, void *closure)
{
    return PyLong_FromSsize_t(((Deferral *)self)->depth);
}

static PyObject *deferral_get_pending(PyObject *self, void *closure)
{
    return PyLong_FromSsize_t(((Deferral *)self)->len);
}

static void deferral_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    free(((Deferral *)self)->pending);
    ((freefunc)PyType_GetSlot(type, Py_tp_free))(self);
    Py_DECREF(type);
}

static PyMethodDef deferral_methods[] = {
    {"enter", deferral_enter, METH_NOARGS, "Starts deferring frees (nests)."},
    {"exit", deferral_exit, METH_NOARGS, "Ends one enter(); the outermost frees what is pending."},
    {"flush", deferral_flush, METH_NOARGS, "Frees what is pending now, deferring or not; returns how many."},
    {"discard", deferral_discard, METH_NOARGS, "Forgets what is pending (its manager is gone)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef deferral_getset[] = {
    {"depth", deferral_get_depth, NULL, "How many enter() calls are open.", NULL},
    {"pending", deferral_get_pending, NULL, "How many frees are waiting.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot deferral_slots[] = {
    {Py_tp_doc, "Holds back the frees of its allocations between enter() and the last exit()."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, deferral_dealloc},
    {Py_tp_methods, deferral_methods},
    {Py_tp_getset, deferral_getset},
    {0, NULL},
};

static PyType_Spec deferral_spec = {
    "kmm._plugin_calls.Deferral", sizeof(Deferral), 0, Py_TPFLAGS_DEFAULT, deferral_slots,
};

/* ------------------------------------------------------------------------------------------ */
/* Allocation: one allocation of kmm_plugin_alloc, freed once: when called (Numba's
 * MemoryPointer.free calls its finalizer) or when collected. */

typedef struct {
    PyObject_HEAD
    uint64_t manager, buffer, address, stream;
    int alive;
    Deferral *deferral; /* strong reference, or NULL */
} Allocation;

static void allocation_release(Allocation *a)
{
    if (!a->alive)
        return;
    a->alive = 0;
    if (a->deferral && a->deferral->depth > 0 && deferral_push(a->deferral, a->manager, a->buffer, a->stream))
        return;
    plugin_free(a->manager, a->buffer, a->stream);
}

static PyObject *allocation_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_Size(args) != 0 || (kwargs && PyDict_Size(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Allocation() takes no arguments");
        return NULL;
    }
    allocation_release((Allocation *)self);
    Py_RETURN_NONE;
}

static PyObject *allocation_get_alive(PyObject *self, void *closure)
{
    return PyBool_FromLong(((Allocation *)self)->alive);
}

static PyObject *allocation_get_address(PyObject *self, void *closure)
{
    return PyLong_FromUnsignedLongLong(((Allocation *)self)->address);
}

static void allocation_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    Allocation *a = (Allocation *)self;
    allocation_release(a);
    Py_XDECREF((PyObject *)a->deferral);
    ((freefunc)PyType_GetSlot(type, Py_tp_free))(self);
    Py_DECREF(type);
}

static PyGetSetDef allocation_getset[] = {
    {"alive", allocation_get_alive, NULL, "False once freed (or handed to its Deferral).", NULL},
    {"address", allocation_get_address, NULL, "The device address (0 for 0 bytes).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot allocation_slots[] = {
    {Py_tp_doc, "One allocation of kmm_plugin_alloc; calling it or collecting it frees it, once."},
    {Py_tp_call, allocation_call},
    {Py_tp_dealloc, allocation_dealloc},
    {Py_tp_getset, allocation_getset},
    {0, NULL},
};

static PyType_Spec allocation_spec = {
    "kmm._plugin_calls.Allocation", sizeof(Allocation), 0, Py_TPFLAGS_DEFAULT, allocation_slots,
};

/* ------------------------------------------------------------------------------------------ */
/* Module functions */

static int as_u64(PyObject *o, const char *name, uint64_t *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "%s must be an int in [0, 2**64)", name);
        return 0;
    }
    *out = (uint64_t)v;
    return 1;
}

static PyObject *bind(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t alloc_address, free_address;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "bind(alloc_address, free_address) takes 2 arguments");
        return NULL;
    }
    if (!as_u64(args[0], "alloc_address", &alloc_address) || !as_u64(args[1], "free_address", &free_address))
        return NULL;
    if (!alloc_address || !free_address) {
        PyErr_SetString(PyExc_ValueError, "bind: the function addresses must not be 0");
        return NULL;
    }
    plugin_alloc = (plugin_alloc_fn)(uintptr_t)alloc_address;
    plugin_free = (plugin_free_fn)(uintptr_t)free_address;
    Py_RETURN_NONE;
}

static PyObject *allocate(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t manager, nbytes, stream, buffer = 0, address = 0;
    Allocation *a;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "allocate(manager, nbytes, stream, deferral) takes 4 arguments");
        return NULL;
    }
    if (!plugin_alloc) {
        PyErr_SetString(PyExc_RuntimeError, "kmm._plugin_calls: bind() was not called");
        return NULL;
    }
    if (!as_u64(args[0], "manager", &manager) || !as_u64(args[1], "nbytes", &nbytes) ||
        !as_u64(args[2], "stream", &stream))
        return NULL;
    if (args[3] != Py_None && !PyObject_TypeCheck(args[3], (PyTypeObject *)DeferralType)) {
        PyErr_SetString(PyExc_TypeError, "deferral must be a kmm._plugin_calls.Deferral or None");
        return NULL;
    }
    if (plugin_alloc(manager, nbytes, KMM_MEMORY_DEVICE, stream, &buffer, &address) != KMM_OK)
        Py_RETURN_NONE; /* the status and message are libkmm's last error */
    a = PyObject_New(Allocation, (PyTypeObject *)AllocationType);
    if (!a) {
        plugin_free(manager, buffer, stream);
        return NULL;
    }
    a->manager = manager;
    a->buffer = buffer;
    a->address = address;
    a->stream = stream;
    a->alive = 1;
    a->deferral = args[3] == Py_None ? NULL : (Deferral *)args[3];
    Py_XINCREF((PyObject *)a->deferral);
    return (PyObject *)a;
}

static PyMethodDef module_methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(alloc_address, free_address): the addresses of libkmm's kmm_plugin_alloc and "
     "kmm_plugin_free."},
    {"allocate", (PyCFunction)(void (*)(void))allocate, METH_FASTCALL,
     "allocate(manager, nbytes, stream, deferral) -> Allocation of device memory, or None when "
     "libkmm failed (kmm_last_status says why)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "kmm._plugin_calls", "The per-allocation calls of kmm.numba, compiled.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__plugin_calls(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    DeferralType = PyType_FromSpec(&deferral_spec);
    AllocationType = PyType_FromSpec(&allocation_spec);
    if (!DeferralType || !AllocationType || PyModule_AddObjectRef(m, "Deferral", DeferralType) < 0 ||
        PyModule_AddObjectRef(m, "Allocation", AllocationType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
