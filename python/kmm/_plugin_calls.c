/* The per-allocation calls of kmm.numba, compiled (kmm.cupy's are in _cupy_calls.c).
 *
 * Numba allocates through its memory-manager plugin at every numba.cuda.device_array, so the
 * plugin's cost is paid per array. Written in Python, that cost was several times what libkmm
 * spends: ctypes' argument conversion and libffi, a Python frame for memalloc, a MemoryPointer
 * built attribute by attribute and a CUdeviceptr for its address. Here an Allocator's memalloc
 * (METH_O, no Python frame) calls libkmm and returns a KmmPointer: Numba's MemoryPointer
 * subclassed in C, whose fields sit past the base's layout, whose CUdeviceptr is made when first
 * asked for, and whose tp_finalize frees the buffer, once.
 *
 * It calls the libkmm that kmm._lib loaded, through the function addresses given to bind(), so
 * a process has one libkmm and one handle registry whichever way libkmm was found.
 * kmm/_plugin_calls_py.py is the same interface in Python (ctypes), used when this module was not
 * built; tests/test_plugin_calls.py runs the same checks on both.
 *
 * Everything here runs with the GIL held, which is what serializes a Deferral's list.
 */
#include "_plugin_calls.h"
#include <structmember.h>
#include <stddef.h>
#include <stdlib.h>

/* Numba allocates without a stream: its memory is for the legacy default stream. */
#define NUMBA_STREAM 0

plugin_alloc_fn plugin_alloc;
plugin_free_fn plugin_free;
static PyObject *DeferralType;
static PyObject *AllocatorType;

/* ------------------------------------------------------------------------------------------ */
/* Deferral: while entered, the frees of its allocations wait in a list (Numba's defer_cleanup). */

/* Numba's frees are all for NUMBA_STREAM, so an entry needs no stream. */
typedef struct {
    uint64_t manager, buffer;
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
        plugin_free(d->pending[i].manager, d->pending[i].buffer, NUMBA_STREAM);
    return n;
}

/* Queues a free; 0 when there is no memory for the entry (the caller then frees at once). */
static int deferral_push(Deferral *d, uint64_t manager, uint64_t buffer)
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
/* KmmPointer: Numba's MemoryPointer for one allocation of kmm_plugin_alloc.
 *
 * The base is a Python class, whose instance layout (dict and weak references, inline or
 * managed) only the running interpreter knows: pointer_type() reads its __basicsize__ and puts
 * PointerFields there. Object fields are T_OBJECT_EX members, so the base's dealloc (CPython's
 * subtype_dealloc, inherited) releases them and the collector sees them, as for __slots__. */

typedef struct {
    PyObject *context;        /* "context": Numba's (a weak proxy), or None */
    PyObject *device_pointer; /* "_kmm_device_pointer": factory(address), made on first use */
    PyObject *deferral;       /* "_kmm_deferral": a Deferral or None */
    Py_ssize_t refct;         /* "refct": Numba's reference count (OwnedPointer) */
    uint64_t manager, buffer, address, size;
    int alive;
} PointerFields;

/* Where PointerFields start in every KmmPointer; 0 until pointer_type() ran. */
static Py_ssize_t fields_offset;
/* The types pointer_type() made (an Allocator accepts only those). */
static PyObject *pointer_types;

#define FIELDS(o) ((PointerFields *)((char *)(o) + fields_offset))

/* Frees the buffer, once: into the Deferral while it defers, else now. */
static void pointer_release(PointerFields *f)
{
    if (!f->alive)
        return;
    f->alive = 0;
    if (f->deferral && PyObject_TypeCheck(f->deferral, (PyTypeObject *)DeferralType)) {
        Deferral *d = (Deferral *)f->deferral;
        if (d->depth > 0 && deferral_push(d, f->manager, f->buffer))
            return;
    }
    plugin_free(f->manager, f->buffer, NUMBA_STREAM);
}

static void pointer_finalize(PyObject *self)
{
    pointer_release(FIELDS(self)); /* raises nothing: libkmm's status is not an exception here */
}

static PyObject *pointer_free(PyObject *self, PyObject *unused)
{
    PointerFields *f = FIELDS(self);
    if (!f->alive) {
        PyErr_SetString(PyExc_RuntimeError, "Freeing dead memory"); /* Numba's message */
        return NULL;
    }
    pointer_release(f);
    Py_RETURN_NONE;
}

static PyObject *pointer_get_device_pointer(PyObject *self, void *closure)
{
    PointerFields *f = FIELDS(self);
    if (!f->device_pointer) {
        PyObject *factory = PyObject_GetAttrString((PyObject *)Py_TYPE(self), "_device_pointer_factory");
        if (!factory)
            return NULL;
        f->device_pointer = PyObject_CallFunction(factory, "K", (unsigned long long)f->address);
        Py_DECREF(factory);
        if (!f->device_pointer)
            return NULL;
    }
    Py_INCREF(f->device_pointer);
    return f->device_pointer;
}

static PyObject *pointer_get_size(PyObject *self, void *closure)
{
    return PyLong_FromUnsignedLongLong(FIELDS(self)->size);
}

static PyObject *pointer_get_address(PyObject *self, void *closure)
{
    return PyLong_FromUnsignedLongLong(FIELDS(self)->address);
}

static PyObject *pointer_get_alive(PyObject *self, void *closure)
{
    return PyBool_FromLong(FIELDS(self)->alive);
}

static PyMethodDef pointer_methods[] = {
    {"free", pointer_free, METH_NOARGS, "Frees the memory now (Numba's explicit free); a second free raises."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef pointer_getset[] = {
    {"device_pointer", pointer_get_device_pointer, NULL, "The address as Numba's pointer type.", NULL},
    {"handle", pointer_get_device_pointer, NULL, "The same as device_pointer (Numba's alias).", NULL},
    {"size", pointer_get_size, NULL, "Bytes allocated.", NULL},
    {"_cuda_memsize_", pointer_get_size, NULL, "Bytes allocated (Numba's name).", NULL},
    {"address", pointer_get_address, NULL, "The device address as an int.", NULL},
    {"alive", pointer_get_alive, NULL, "False once freed (or handed to its Deferral).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *pointer_type(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *base, *factory, *basicsize_obj, *bases, *type;
    Py_ssize_t base_size, offset;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "pointer_type(base, device_pointer_factory) takes 2 arguments");
        return NULL;
    }
    base = args[0];
    factory = args[1];
    if (!PyType_Check(base) || !PyCallable_Check(factory)) {
        PyErr_SetString(PyExc_TypeError, "pointer_type: base must be a class and device_pointer_factory callable");
        return NULL;
    }
    basicsize_obj = PyObject_GetAttrString(base, "__basicsize__");
    if (!basicsize_obj)
        return NULL;
    base_size = PyLong_AsSsize_t(basicsize_obj);
    Py_DECREF(basicsize_obj);
    if (base_size < 0)
        return NULL;
    offset = (base_size + 7) & ~(Py_ssize_t)7;
    if (fields_offset && offset != fields_offset) {
        PyErr_Format(PyExc_TypeError, "pointer_type: base %R lays out %zd bytes: the fields would start at "
                     "byte %zd, not %zd as in the first pointer type", base, base_size, offset, fields_offset);
        return NULL;
    }
    PyMemberDef members[] = {
        {"context", T_OBJECT_EX, offset + offsetof(PointerFields, context), 0, "Numba's context (a weak proxy)."},
        {"_kmm_device_pointer", T_OBJECT_EX, offset + offsetof(PointerFields, device_pointer), 0, NULL},
        {"_kmm_deferral", T_OBJECT_EX, offset + offsetof(PointerFields, deferral), 0, NULL},
        {"refct", T_PYSSIZET, offset + offsetof(PointerFields, refct), 0, "Numba's reference count."},
        {NULL, 0, 0, 0, NULL},
    };
    PyType_Slot slots[] = {
        {Py_tp_doc, "Numba's MemoryPointer for one Kmm allocation; freed once, by free() or when collected."},
        {Py_tp_finalize, pointer_finalize},
        {Py_tp_methods, pointer_methods},
        {Py_tp_getset, pointer_getset},
        {Py_tp_members, members},
        {0, NULL},
    };
    PyType_Spec spec = {
        "kmm._plugin_calls.KmmPointer", (int)(offset + sizeof(PointerFields)), 0,
        Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, slots,
    };
    bases = PyTuple_Pack(1, base);
    if (!bases)
        return NULL;
    type = PyType_FromSpecWithBases(&spec, bases); /* copies members and slots */
    Py_DECREF(bases);
    if (!type)
        return NULL;
    if (PyObject_SetAttrString(type, "_device_pointer_factory", factory) < 0 ||
        PyObject_SetAttrString(type, "is_managed", Py_True) < 0 ||
        PyObject_SetAttrString(type, "_owner", Py_None) < 0 || PyList_Append(pointer_types, type) < 0) {
        Py_DECREF(type);
        return NULL;
    }
    fields_offset = offset;
    return type;
}

/* ------------------------------------------------------------------------------------------ */
/* Allocator: a plugin's memalloc. It serves what it can with one libkmm call and hands the rest
 * (no manager yet, an empty or unusual size, a failure) to `fallback`, Python. */

typedef struct {
    PyObject_HEAD
    unsigned long long manager; /* a KmmManager handle; 0: none (fallback creates it) */
    PyObject *context;
    PyObject *pointer_type;
    PyObject *deferral;
    PyObject *fallback;
} Allocator;

/* A KmmPointer of `size` bytes (> 0), or NULL: with an exception set when Python failed, without
 * one when libkmm did (kmm_last_status says why). */
static PyObject *allocator_new_pointer(Allocator *a, uint64_t size)
{
    uint64_t buffer = 0, address = 0;
    PyObject *p;
    PointerFields *f;
    if (!a->pointer_type) {
        PyErr_SetString(PyExc_RuntimeError, "Allocator: cleared by the garbage collector");
        return NULL;
    }
    if (plugin_alloc(a->manager, size, KMM_MEMORY_DEVICE, NUMBA_STREAM, &buffer, &address) != KMM_OK)
        return NULL;
    p = ((allocfunc)PyType_GetSlot((PyTypeObject *)a->pointer_type, Py_tp_alloc))((PyTypeObject *)a->pointer_type, 0);
    if (!p) {
        plugin_free(a->manager, buffer, NUMBA_STREAM);
        return NULL;
    }
    f = FIELDS(p); /* zeroed by tp_alloc */
    f->context = a->context;
    Py_INCREF(f->context);
    f->deferral = a->deferral;
    Py_INCREF(f->deferral);
    f->refct = 1;
    f->manager = a->manager;
    f->buffer = buffer;
    f->address = address;
    f->size = size;
    f->alive = 1;
    return p;
}

static PyObject *allocator_memalloc(PyObject *self, PyObject *size_obj)
{
    Allocator *a = (Allocator *)self;
    if (a->manager && PyLong_CheckExact(size_obj)) {
        unsigned long long size = PyLong_AsUnsignedLongLong(size_obj);
        if (size != 0 && size != (unsigned long long)-1) {
            PyObject *p = allocator_new_pointer(a, size);
            if (p || PyErr_Occurred())
                return p;
        }
        PyErr_Clear(); /* a size out of range: the fallback says what is wrong with it */
    }
    if (!a->fallback) {
        PyErr_SetString(PyExc_RuntimeError, "Allocator: cleared by the garbage collector");
        return NULL;
    }
    return PyObject_CallFunctionObjArgs(a->fallback, size_obj, NULL);
}

static PyObject *allocator_allocate(PyObject *self, PyObject *size_obj)
{
    Allocator *a = (Allocator *)self;
    unsigned long long size;
    PyObject *p;
    if (!a->manager) {
        PyErr_SetString(PyExc_RuntimeError, "Allocator.allocate: manager is 0 (no Kmm manager yet)");
        return NULL;
    }
    size = PyLong_AsUnsignedLongLong(size_obj);
    if (size == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "size must be an int in [1, 2**64), got %R", size_obj);
        return NULL;
    }
    if (size == 0) {
        PyErr_SetString(PyExc_ValueError, "size must be an int in [1, 2**64), got 0 (an empty allocation has no buffer)");
        return NULL;
    }
    p = allocator_new_pointer(a, size);
    if (p || PyErr_Occurred())
        return p;
    Py_RETURN_NONE;
}

static PyObject *allocator_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *ptype, *deferral, *fallback;
    Allocator *a;
    int known;
    static char *keywords[] = {"pointer_type", "deferral", "fallback", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:Allocator", keywords, &ptype, &deferral, &fallback))
        return NULL;
    if (!plugin_alloc) {
        PyErr_SetString(PyExc_RuntimeError, "Allocator: kmm._plugin_calls.bind() was not called");
        return NULL;
    }
    known = PySequence_Contains(pointer_types, ptype);
    if (known < 0)
        return NULL;
    if (!known) {
        PyErr_SetString(PyExc_TypeError, "Allocator: pointer_type must come from pointer_type()");
        return NULL;
    }
    if (deferral != Py_None && !PyObject_TypeCheck(deferral, (PyTypeObject *)DeferralType)) {
        PyErr_SetString(PyExc_TypeError, "Allocator: deferral must be a kmm._plugin_calls.Deferral or None");
        return NULL;
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "Allocator: fallback must be callable");
        return NULL;
    }
    a = (Allocator *)((allocfunc)PyType_GetSlot(type, Py_tp_alloc))(type, 0);
    if (!a)
        return NULL;
    Py_INCREF(Py_None);
    a->context = Py_None;
    Py_INCREF(ptype);
    a->pointer_type = ptype;
    Py_INCREF(deferral);
    a->deferral = deferral;
    Py_INCREF(fallback);
    a->fallback = fallback;
    return (PyObject *)a;
}

static int allocator_traverse(PyObject *self, visitproc visit, void *arg)
{
    Allocator *a = (Allocator *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(a->context);
    Py_VISIT(a->pointer_type);
    Py_VISIT(a->deferral);
    Py_VISIT(a->fallback);
    return 0;
}

static int allocator_clear(PyObject *self)
{
    Allocator *a = (Allocator *)self;
    a->manager = 0;
    Py_CLEAR(a->context);
    Py_CLEAR(a->pointer_type); /* allocator_new_pointer refuses from now on */
    Py_CLEAR(a->deferral);
    Py_CLEAR(a->fallback);
    return 0;
}

static void allocator_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    allocator_clear(self);
    ((freefunc)PyType_GetSlot(type, Py_tp_free))(self);
    Py_DECREF(type);
}

static int allocator_set_context(PyObject *self, PyObject *value, void *closure)
{
    Allocator *a = (Allocator *)self;
    if (!value) {
        PyErr_SetString(PyExc_AttributeError, "context cannot be deleted (set None)");
        return -1;
    }
    PyObject *old = a->context;
    Py_INCREF(value);
    a->context = value;
    Py_XDECREF(old);
    return 0;
}

static PyObject *allocator_get_context(PyObject *self, void *closure)
{
    Allocator *a = (Allocator *)self;
    PyObject *context = a->context ? a->context : Py_None;
    Py_INCREF(context);
    return context;
}

static PyMethodDef allocator_methods[] = {
    {"memalloc", allocator_memalloc, METH_O,
     "memalloc(size) -> a KmmPointer of size bytes, or what fallback(size) returns when this "
     "cannot serve it (no manager, an empty or unusual size, libkmm failed)."},
    {"allocate", allocator_allocate, METH_O,
     "allocate(size) -> a KmmPointer of size (>= 1) bytes, or None when libkmm failed "
     "(kmm_last_status says why)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef allocator_members[] = {
    {"manager", T_ULONGLONG, offsetof(Allocator, manager), 0, "The KmmManager handle allocated from; 0: none."},
    {"pointer_type", T_OBJECT, offsetof(Allocator, pointer_type), READONLY, NULL},
    {"deferral", T_OBJECT, offsetof(Allocator, deferral), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef allocator_getset[] = {
    {"context", allocator_get_context, allocator_set_context, "The context the pointers carry.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot allocator_slots[] = {
    {Py_tp_doc, "Allocator(pointer_type, deferral, fallback): a Numba plugin's memalloc, in C."},
    {Py_tp_new, allocator_new},
    {Py_tp_traverse, allocator_traverse},
    {Py_tp_clear, allocator_clear},
    {Py_tp_dealloc, allocator_dealloc},
    {Py_tp_methods, allocator_methods},
    {Py_tp_members, allocator_members},
    {Py_tp_getset, allocator_getset},
    {0, NULL},
};

static PyType_Spec allocator_spec = {
    "kmm._plugin_calls.Allocator", sizeof(Allocator), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, allocator_slots,
};

/* ------------------------------------------------------------------------------------------ */
/* Module */

int as_u64(PyObject *o, const char *name, uint64_t *out)
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

static PyMethodDef module_methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(alloc_address, free_address): the addresses of libkmm's kmm_plugin_alloc and "
     "kmm_plugin_free (before any Allocator allocates)."},
    {"pointer_type", (PyCFunction)(void (*)(void))pointer_type, METH_FASTCALL,
     "pointer_type(base, device_pointer_factory) -> KmmPointer, a subclass of base (Numba's "
     "MemoryPointer) whose device_pointer is device_pointer_factory(address), made on first use."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "kmm._plugin_calls", "The per-allocation calls of kmm.numba and kmm.cupy, compiled.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__plugin_calls(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    DeferralType = PyType_FromSpec(&deferral_spec);
    AllocatorType = PyType_FromSpec(&allocator_spec);
    pointer_types = PyList_New(0);
    if (!DeferralType || !AllocatorType || !pointer_types || PyModule_AddObjectRef(m, "Deferral", DeferralType) < 0 ||
        PyModule_AddObjectRef(m, "Allocator", AllocatorType) < 0 || cupy_calls_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
