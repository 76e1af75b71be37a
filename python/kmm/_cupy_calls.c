/* kmm.cupy's allocator, compiled: cupy_allocate(nbytes) is what cupy.cuda.set_allocator gets, so
 * CuPy calls it at every cupy.empty.
 *
 * It reads CuPy's current device and stream through CuPy's own C functions, allocates with one
 * kmm_plugin_alloc on the device's manager, and returns MemoryPointer(memory, 0), the two objects
 * CuPy's own pool builds too: `memory` is a CupyAllocation, a subclass of CuPy's UnownedMemory
 * that frees the buffer (kmm_plugin_free, after the work queued on the allocation's stream) when
 * CuPy lets go of it. Both are made through their types' __new__ and __init__ slots, as calling
 * the types would. By buffer handle: libkmm keeps no table by address, which CuPy's
 * CFunctionAllocator (kmm_cupy_malloc, freed by address) needs. On an H200 host that path cost
 * about 0.6 us per cupy.empty more than a C allocator that does nothing; this one skips the table
 * and CFunctionAllocator's Python-level constructor, and (on the build machine) an owner object
 * beside an UnownedMemory cost a tenth of the allocator's time.
 *
 * An allocation made for a stream other than CuPy's default ones (handles 0, 1 and 2, which live
 * as long as the process) holds CuPy's Stream object, from `stream_object()`, until its free: the
 * free is ordered after that stream, which must not be destroyed first (a `with Stream():` block
 * whose stream is collected while its arrays live).
 *
 * An empty request gets MemoryPointer(UnownedMemory(0, 0, None, device), 0), no buffer, as CuPy's
 * own pool gives no memory to one. What it does not serve it hands to `fallback(nbytes, status)`,
 * Python: the first allocation on a device (which makes the device's manager and registers it
 * here with cupy_set_manager), a size that is not an int in [0, 2**64), a device past the table
 * (status 0: not tried here), and a libkmm failure (its status: out of memory is raised as CuPy's
 * OutOfMemoryError without a second try, a closed manager is replaced).
 *
 * Everything here runs with the GIL held, which is what guards the tables. */
#include "_plugin_calls.h"
#include <structmember.h>

/* CuPy's get_current_stream_ptr (`intptr_t (void)`) and get_device_id (a cpdef function: `int
 * (int skip_dispatch)`); each returns -1 with an exception set when it fails. */
typedef intptr_t (*stream_source_fn)(void);
typedef int (*device_source_fn)(int skip_dispatch);

static stream_source_fn current_stream;
static device_source_fn current_device;
static PyObject *memory_pointer_type; /* cupy.cuda.memory.MemoryPointer */
static PyObject *fallback;            /* fallback(nbytes, status) -> MemoryPointer, or raises */
static PyObject *stream_object;       /* cupy.cuda.get_current_stream */
static PyObject *AllocationType;      /* CupyAllocation, made by the first cupy_bind */

/* Each device's manager: its handle, and the kmm.Manager that owns it (every allocation holds a
 * reference, so the handle outlives the memory). A device past the table takes the fallback. */
#define MAX_DEVICES 64
static struct {
    uint64_t handle;
    PyObject *manager;
} managers[MAX_DEVICES];

/* Allocations made here and not yet freed (kmm.cupy.live_allocations). */
static Py_ssize_t live;

/* ------------------------------------------------------------------------------------------ */
/* CupyAllocation: the memory CuPy keeps alive, a subclass of CuPy's UnownedMemory made by
 * cupy_bind (so one object per allocation, where an owner beside an UnownedMemory would be two).
 * UnownedMemory's own fields (ptr, size, device_id, _owner = None) are set by its __init__; ours
 * follow its layout, at `fields_offset` (the limited API cannot name the base's struct). */

typedef struct {
    PyObject *manager;
    PyObject *stream_owner; /* CuPy's Stream for a stream that may be destroyed, else NULL */
    uint64_t handle, buffer, stream; /* buffer 0: nothing to free (its __init__ failed) */
} Fields;

static Py_ssize_t fields_offset;
static PyTypeObject *unowned_base; /* the UnownedMemory subclassed */
#define FIELDS(o) ((Fields *)((char *)(o) + fields_offset))

static void allocation_dealloc(PyObject *self)
{
    Fields *a = FIELDS(self);
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (a->buffer) {
        /* A manager closed meanwhile answers KMM_ERROR_INVALID_HANDLE: its memory went with it. */
        plugin_free(a->handle, a->buffer, a->stream);
        live--;
    }
    Py_CLEAR(a->stream_owner); /* after the free that records an event on it */
    Py_CLEAR(a->manager);
    /* UnownedMemory's own teardown (its _owner, then the object's memory); the type's reference
     * is ours to drop, as for any instance of a heap type. */
    ((destructor)PyType_GetSlot(unowned_base, Py_tp_dealloc))(self);
    Py_DECREF(type);
}

/* Tracked by the collector: a Stream the allocation holds may hold the allocation's memory in
 * turn (a workspace array kept on the stream object), a cycle only the collector can end. */
static int allocation_traverse(PyObject *self, visitproc visit, void *arg)
{
    Fields *a = FIELDS(self);
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(a->manager);
    Py_VISIT(a->stream_owner);
    traverseproc base = (traverseproc)PyType_GetSlot(unowned_base, Py_tp_traverse);
    return base ? base(self, visit, arg) : 0;
}

/* Only in a cycle: the Stream's reference goes; the buffer is freed when the allocation is, with
 * the raw stream it keeps. */
static int allocation_clear(PyObject *self)
{
    Py_CLEAR(FIELDS(self)->stream_owner);
    inquiry base = (inquiry)PyType_GetSlot(unowned_base, Py_tp_clear);
    return base ? base(self) : 0;
}

/* The members, at offsets within Fields; fields_offset is added when the type is made. */
static const PyMemberDef allocation_member_templates[] = {
    {"manager", T_OBJECT, offsetof(Fields, manager), READONLY, "The kmm.Manager allocated from."},
    {"stream_owner", T_OBJECT, offsetof(Fields, stream_owner), READONLY,
     "CuPy's Stream the memory was allocated for, kept alive until the free (None for CuPy's default streams)."},
    {"buffer", T_ULONGLONG, offsetof(Fields, buffer), READONLY, "The KmmBuffer handle."},
    {"stream", T_ULONGLONG, offsetof(Fields, stream), READONLY, "The stream its free is ordered after."},
};
#define MEMBER_COUNT (sizeof allocation_member_templates / sizeof allocation_member_templates[0])
static PyMemberDef allocation_members[MEMBER_COUNT + 1];

static PyType_Slot allocation_slots[] = {
    {Py_tp_doc, "CuPy's UnownedMemory over one buffer of kmm.cupy's allocator; frees it (after the work "
                "queued on its stream) when CuPy drops the memory."},
    {Py_tp_dealloc, allocation_dealloc},
    {Py_tp_traverse, allocation_traverse},
    {Py_tp_clear, allocation_clear},
    {Py_tp_members, allocation_members},
    {0, NULL},
};

/* CupyAllocation, subclassing `unowned` (CuPy's UnownedMemory); NULL with an exception set. */
static PyObject *make_allocation_type(PyObject *unowned)
{
    PyObject *basicsize = PyObject_GetAttrString(unowned, "__basicsize__");
    if (!basicsize)
        return NULL;
    Py_ssize_t base_size = PyLong_AsSsize_t(basicsize);
    Py_DECREF(basicsize);
    if (base_size < 0)
        return NULL;
    Py_ssize_t align = _Alignof(Fields);
    Py_ssize_t offset = (base_size + align - 1) / align * align;
    for (size_t i = 0; i < MEMBER_COUNT; i++) {
        allocation_members[i] = allocation_member_templates[i];
        allocation_members[i].offset += offset;
    }
    PyType_Spec spec = {"kmm._plugin_calls.CupyAllocation", (int)(offset + sizeof(Fields)), 0,
                        Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION, allocation_slots};
    PyObject *bases = PyTuple_Pack(1, unowned);
    if (!bases)
        return NULL;
    PyObject *type = PyType_FromSpecWithBases(&spec, bases);
    Py_DECREF(bases);
    if (type)
        fields_offset = offset;
    return type;
}

/* ------------------------------------------------------------------------------------------ */
/* The allocator */

/* `type(*args)` as type() calls it (its __new__, then its __init__), for CuPy's memory types,
 * whose __new__ returns an instance of `type`; NULL with an exception set. */
static PyObject *construct(PyTypeObject *type, PyTypeObject *base, PyObject *args)
{
    PyObject *o = ((newfunc)PyType_GetSlot(base, Py_tp_new))(type, args, NULL);
    if (o && ((initproc)PyType_GetSlot(base, Py_tp_init))(o, args, NULL) < 0)
        Py_CLEAR(o);
    return o;
}

/* MemoryPointer(memory, 0), for a new reference `memory` given up here; NULL with an exception
 * set. */
static PyObject *memory_pointer(PyObject *memory)
{
    PyObject *zero = PyLong_FromLong(0), *args = NULL, *mp = NULL;
    if (zero)
        args = PyTuple_Pack(2, memory, zero);
    if (args)
        mp = construct((PyTypeObject *)memory_pointer_type, (PyTypeObject *)memory_pointer_type, args);
    Py_XDECREF(args);
    Py_XDECREF(zero);
    Py_DECREF(memory);
    return mp;
}

/* `type(address, size, None, device)`, where `type` is UnownedMemory or CupyAllocation (whose
 * instantiation from Python is refused); NULL with an exception set. */
static PyObject *unowned_memory(PyTypeObject *type, uint64_t address, PyObject *size, int device)
{
    PyObject *a0 = PyLong_FromUnsignedLongLong(address), *a3 = PyLong_FromLong(device), *args = NULL, *mem = NULL;
    if (a0 && a3)
        args = PyTuple_Pack(4, a0, size, Py_None, a3);
    if (args)
        mem = construct(type, unowned_base, args);
    Py_XDECREF(args);
    Py_XDECREF(a0);
    Py_XDECREF(a3);
    return mem;
}

/* The allocation of `size` bytes on CuPy's current device and stream; NULL with an exception
 * set when CuPy's queries or Python failed, without one when the fallback should serve the
 * request (*status: libkmm's refusal, or 0 where it was not asked). */
static PyObject *allocate(PyObject *size_obj, uint64_t size, uint32_t *status)
{
    int device = current_device(1);
    if (device == -1 && PyErr_Occurred())
        return NULL;
    if (size == 0) {
        PyObject *mem = unowned_memory(unowned_base, 0, size_obj, device);
        return mem ? memory_pointer(mem) : NULL;
    }
    if (device < 0 || device >= MAX_DEVICES || !managers[device].handle)
        return NULL;
    intptr_t stream = current_stream();
    if (stream == -1 && PyErr_Occurred())
        return NULL;
    /* A stream of the user's, not one of CuPy's default streams (0, 1, 2): its Stream object, so
     * that the stream outlives the memory's free. */
    PyObject *stream_owner = NULL;
    if ((uintptr_t)stream > 2 && stream_object) {
        stream_owner = PyObject_CallObject(stream_object, NULL);
        if (!stream_owner)
            return NULL;
    }
    uint64_t handle = managers[device].handle, buffer = 0, address = 0;
    *status = plugin_alloc(handle, size, KMM_MEMORY_DEVICE, (uint64_t)stream, &buffer, &address);
    if (*status != KMM_OK) {
        Py_XDECREF(stream_owner);
        return NULL;
    }
    /* Python may run in the calls below (a collection): the table's entry is read before them. */
    PyObject *manager = managers[device].manager;
    Py_INCREF(manager);
    PyObject *mem = unowned_memory((PyTypeObject *)AllocationType, address, size_obj, device);
    if (!mem) {
        plugin_free(handle, buffer, (uint64_t)stream);
        Py_XDECREF(stream_owner);
        Py_DECREF(manager);
        return NULL;
    }
    Fields *a = FIELDS(mem);
    live++;
    a->stream_owner = stream_owner;
    a->manager = manager;
    a->handle = handle;
    a->buffer = buffer;
    a->stream = (uint64_t)stream;
    return memory_pointer(mem);
}

static PyObject *cupy_allocate(PyObject *module, PyObject *size_obj)
{
    if (!fallback) {
        PyErr_SetString(PyExc_RuntimeError,
                        "cupy_allocate: not bound (kmm._plugin_calls.cupy_bind() was not called, or the interpreter is exiting)");
        return NULL;
    }
    uint32_t status = KMM_OK;
    if (plugin_alloc && PyLong_CheckExact(size_obj)) {
        unsigned long long size = PyLong_AsUnsignedLongLong(size_obj);
        if (size == (unsigned long long)-1 && PyErr_Occurred())
            PyErr_Clear(); /* out of range: the fallback says what is wrong with it */
        else {
            PyObject *mp = allocate(size_obj, size, &status);
            if (mp || PyErr_Occurred())
                return mp;
        }
    }
    PyObject *status_obj = PyLong_FromUnsignedLong(status);
    if (!status_obj)
        return NULL;
    PyObject *mp = PyObject_CallFunctionObjArgs(fallback, size_obj, status_obj, NULL);
    Py_DECREF(status_obj);
    return mp;
}

/* ------------------------------------------------------------------------------------------ */
/* Setup, from kmm.cupy */

/* *slot = value, a new reference; the old one released last (its release may run Python). */
static void replace(PyObject **slot, PyObject *value)
{
    PyObject *old = *slot;
    Py_INCREF(value);
    *slot = value;
    Py_XDECREF(old);
}

static int address_of(PyObject *o, const char *name, void **out)
{
    uint64_t v;
    if (!as_u64(o, name, &v))
        return 0;
    if (!v) {
        PyErr_Format(PyExc_ValueError, "%s must be a function's address, not 0", name);
        return 0;
    }
    *out = (void *)(uintptr_t)v;
    return 1;
}

static PyObject *cupy_bind(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    void *stream, *device;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "cupy_bind(stream_source, device_source, UnownedMemory, MemoryPointer, "
                                         "fallback, stream_object) takes 6 arguments");
        return NULL;
    }
    if (!address_of(args[0], "stream_source", &stream) || !address_of(args[1], "device_source", &device))
        return NULL;
    if (!PyType_Check(args[2]) || !PyType_Check(args[3]) || !PyCallable_Check(args[4]) || !PyCallable_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "cupy_bind: UnownedMemory and MemoryPointer must be types, fallback and stream_object callable");
        return NULL;
    }
    for (int i = 2; i < 4; i++)
        if (!PyType_GetSlot((PyTypeObject *)args[i], Py_tp_new) || !PyType_GetSlot((PyTypeObject *)args[i], Py_tp_init)) {
            PyErr_SetString(PyExc_TypeError, "cupy_bind: UnownedMemory and MemoryPointer must have __new__ and __init__");
            return NULL;
        }
    if (!AllocationType) {
        /* Made once: allocations outlive a later bind (and cupy_release at exit). */
        PyObject *type = make_allocation_type(args[2]);
        if (!type || PyModule_AddObjectRef(module, "CupyAllocation", type) < 0) {
            Py_XDECREF(type);
            return NULL;
        }
        Py_INCREF(args[2]);
        unowned_base = (PyTypeObject *)args[2];
        AllocationType = type;
    } else if (args[2] != (PyObject *)unowned_base) {
        PyErr_SetString(PyExc_TypeError, "cupy_bind: UnownedMemory is not the type bound before");
        return NULL;
    }
    current_stream = (stream_source_fn)stream;
    current_device = (device_source_fn)device;
    replace(&memory_pointer_type, args[3]);
    replace(&fallback, args[4]);
    replace(&stream_object, args[5]);
    Py_RETURN_NONE;
}

static PyObject *cupy_set_manager(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    long device;
    unsigned long long handle;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "cupy_set_manager(device, handle, manager) takes 3 arguments");
        return NULL;
    }
    device = PyLong_AsLong(args[0]);
    if (device == -1 && PyErr_Occurred())
        return NULL;
    handle = PyLong_AsUnsignedLongLong(args[1]);
    if (handle == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (device < 0 || device >= MAX_DEVICES)
        Py_RETURN_FALSE; /* served by the fallback */
    /* The entry changes whole before the old manager is let go (its release may run Python that
     * allocates). */
    PyObject *old = managers[device].manager;
    Py_INCREF(args[2]);
    managers[device].manager = args[2];
    managers[device].handle = handle;
    Py_XDECREF(old);
    Py_RETURN_TRUE;
}

static void clear_managers(void)
{
    for (int d = 0; d < MAX_DEVICES; d++) {
        managers[d].handle = 0; /* before the release, which may run Python */
        Py_CLEAR(managers[d].manager);
    }
}

static PyObject *cupy_clear_managers(PyObject *module, PyObject *unused)
{
    clear_managers();
    Py_RETURN_NONE;
}

/* At exit: lets go of the managers and of the Python objects bound (the fallback keeps
 * kmm.cupy's globals, and so its managers, alive), so that the managers' teardown runs. */
static PyObject *cupy_release(PyObject *module, PyObject *unused)
{
    clear_managers();
    Py_CLEAR(fallback);
    Py_CLEAR(stream_object);
    Py_CLEAR(memory_pointer_type);
    Py_RETURN_NONE;
}

static PyObject *cupy_live(PyObject *module, PyObject *unused)
{
    return PyLong_FromSsize_t(live);
}

static PyMethodDef cupy_methods[] = {
    {"cupy_allocate", cupy_allocate, METH_O,
     "cupy_allocate(nbytes) -> a cupy.cuda.MemoryPointer to nbytes of device memory on CuPy's current "
     "device and stream, from that device's Kmm manager (for cupy.cuda.set_allocator)."},
    {"cupy_bind", (PyCFunction)(void (*)(void))cupy_bind, METH_FASTCALL,
     "cupy_bind(stream_source, device_source, UnownedMemory, MemoryPointer, fallback, stream_object): the "
     "addresses of CuPy's get_current_stream_ptr and get_device_id, CuPy's memory types, fallback(nbytes, status), "
     "the Python allocator for what cupy_allocate does not serve (status: libkmm's refusal, or 0), and "
     "stream_object() -> CuPy's current Stream, held by allocations for streams other than CuPy's defaults."},
    {"cupy_set_manager", (PyCFunction)(void (*)(void))cupy_set_manager, METH_FASTCALL,
     "cupy_set_manager(device, handle, manager) -> whether cupy_allocate serves the device from it."},
    {"cupy_clear_managers", cupy_clear_managers, METH_NOARGS, "Forgets every device's manager."},
    {"cupy_release", cupy_release, METH_NOARGS,
     "Forgets the managers and what cupy_bind bound (at exit); cupy_allocate then refuses."},
    {"cupy_live", cupy_live, METH_NOARGS, "How many allocations of cupy_allocate are live."},
    {NULL, NULL, 0, NULL},
};

int cupy_calls_init(PyObject *module)
{
    return PyModule_AddFunctions(module, cupy_methods);
}
