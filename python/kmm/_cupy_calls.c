/* kmm.cupy's allocator, compiled: cupy_allocate(nbytes) is what cupy.cuda.set_allocator gets, so
 * CuPy calls it at every cupy.empty.
 *
 * It reads CuPy's current device and stream through CuPy's own C functions, allocates with one
 * kmm_plugin_alloc on the device's manager, and returns MemoryPointer(UnownedMemory(address,
 * nbytes, owner, device), 0), the objects CuPy's own pool builds too. The owner, a CupyAllocation,
 * frees the buffer (kmm_plugin_free, after the work queued on the allocation's stream) when CuPy
 * lets go of the memory. By buffer handle: libkmm keeps no table by address, which CuPy's
 * CFunctionAllocator (kmm_cupy_malloc, freed by address) needs. On an H200 host that path cost
 * about 0.6 us per cupy.empty more than a C allocator that does nothing; this one skips the table
 * and CFunctionAllocator's Python-level constructor.
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
static PyObject *unowned_memory_type; /* cupy.cuda.memory.UnownedMemory */
static PyObject *memory_pointer_type; /* cupy.cuda.memory.MemoryPointer */
static PyObject *fallback;            /* fallback(nbytes, status) -> MemoryPointer, or raises */
static PyObject *stream_object;       /* cupy.cuda.get_current_stream */
static PyObject *AllocationType;

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
/* CupyAllocation: the owner CuPy keeps alive with the memory. */

typedef struct {
    PyObject_HEAD
    PyObject *manager;
    PyObject *stream_owner; /* CuPy's Stream for a stream that may be destroyed, else NULL */
    uint64_t handle, buffer, stream, address, size;
} Allocation;

static void allocation_dealloc(PyObject *self)
{
    Allocation *a = (Allocation *)self;
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    /* A manager closed meanwhile answers KMM_ERROR_INVALID_HANDLE: its memory went with it. */
    plugin_free(a->handle, a->buffer, a->stream);
    live--;
    Py_XDECREF(a->stream_owner); /* after the free that records an event on it */
    Py_XDECREF(a->manager);
    ((freefunc)PyType_GetSlot(type, Py_tp_free))(self);
    Py_DECREF(type);
}

/* Tracked by the collector: a Stream the allocation holds may hold the allocation's memory in
 * turn (a workspace array kept on the stream object), a cycle only the collector can end. */
static int allocation_traverse(PyObject *self, visitproc visit, void *arg)
{
    Allocation *a = (Allocation *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(a->manager);
    Py_VISIT(a->stream_owner);
    return 0;
}

/* Only in a cycle: the Stream's reference goes; the buffer is freed when the allocation is, with
 * the raw stream it keeps. */
static int allocation_clear(PyObject *self)
{
    Py_CLEAR(((Allocation *)self)->stream_owner);
    return 0;
}

static PyMemberDef allocation_members[] = {
    {"manager", T_OBJECT, offsetof(Allocation, manager), READONLY, "The kmm.Manager allocated from."},
    {"stream_owner", T_OBJECT, offsetof(Allocation, stream_owner), READONLY,
     "CuPy's Stream the memory was allocated for, kept alive until the free (None for CuPy's default streams)."},
    {"buffer", T_ULONGLONG, offsetof(Allocation, buffer), READONLY, "The KmmBuffer handle."},
    {"stream", T_ULONGLONG, offsetof(Allocation, stream), READONLY, "The stream its free is ordered after."},
    {"address", T_ULONGLONG, offsetof(Allocation, address), READONLY, NULL},
    {"size", T_ULONGLONG, offsetof(Allocation, size), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot allocation_slots[] = {
    {Py_tp_doc, "One buffer of kmm.cupy's allocator; freed (after the work queued on its stream) "
                "when CuPy drops the memory."},
    {Py_tp_dealloc, allocation_dealloc},
    {Py_tp_traverse, allocation_traverse},
    {Py_tp_clear, allocation_clear},
    {Py_tp_members, allocation_members},
    {0, NULL},
};

static PyType_Spec allocation_spec = {
    "kmm._plugin_calls.CupyAllocation", sizeof(Allocation), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_HAVE_GC,
    allocation_slots,
};

/* ------------------------------------------------------------------------------------------ */
/* The allocator */

/* MemoryPointer(UnownedMemory(address, size, owner, device), 0), owning `owner` (a new
 * reference, given up here); NULL with an exception set. */
static PyObject *memory_pointer(PyObject *owner, uint64_t address, uint64_t size, int device)
{
    PyObject *args = PyTuple_New(4), *mem = NULL, *mp = NULL;
    if (!args) {
        Py_DECREF(owner);
        return NULL;
    }
    PyTuple_SetItem(args, 2, owner); /* steals owner, also on the failures below */
    PyObject *a0 = PyLong_FromUnsignedLongLong(address), *a1 = PyLong_FromUnsignedLongLong(size),
             *a3 = PyLong_FromLong(device);
    if (a0 && a1 && a3) {
        PyTuple_SetItem(args, 0, a0);
        PyTuple_SetItem(args, 1, a1);
        PyTuple_SetItem(args, 3, a3);
        mem = PyObject_Call(unowned_memory_type, args, NULL);
    } else {
        Py_XDECREF(a0);
        Py_XDECREF(a1);
        Py_XDECREF(a3);
    }
    Py_DECREF(args);
    if (!mem)
        return NULL;
    PyObject *zero = PyLong_FromLong(0);
    if (zero) {
        mp = PyObject_CallFunctionObjArgs(memory_pointer_type, mem, zero, NULL);
        Py_DECREF(zero);
    }
    Py_DECREF(mem);
    return mp;
}

/* The allocation of `size` bytes on CuPy's current device and stream; NULL with an exception
 * set when CuPy's queries or Python failed, without one when the fallback should serve the
 * request (*status: libkmm's refusal, or 0 where it was not asked). */
static PyObject *allocate(uint64_t size, uint32_t *status)
{
    int device = current_device(1);
    if (device == -1 && PyErr_Occurred())
        return NULL;
    if (size == 0) {
        Py_INCREF(Py_None);
        return memory_pointer(Py_None, 0, 0, device);
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
    Allocation *a = (Allocation *)((allocfunc)PyType_GetSlot((PyTypeObject *)AllocationType, Py_tp_alloc))(
        (PyTypeObject *)AllocationType, 0);
    if (!a) {
        plugin_free(handle, buffer, (uint64_t)stream);
        Py_XDECREF(stream_owner);
        return NULL;
    }
    live++;
    a->stream_owner = stream_owner;
    a->manager = managers[device].manager;
    Py_INCREF(a->manager);
    a->handle = handle;
    a->buffer = buffer;
    a->stream = (uint64_t)stream;
    a->address = address;
    a->size = size;
    return memory_pointer((PyObject *)a, address, size, device);
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
            PyObject *mp = allocate(size, &status);
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
    current_stream = (stream_source_fn)stream;
    current_device = (device_source_fn)device;
    replace(&unowned_memory_type, args[2]);
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
    Py_CLEAR(unowned_memory_type);
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
    AllocationType = PyType_FromSpec(&allocation_spec);
    if (!AllocationType || PyModule_AddObjectRef(module, "CupyAllocation", AllocationType) < 0 ||
        PyModule_AddFunctions(module, cupy_methods) < 0)
        return -1;
    return 0;
}
