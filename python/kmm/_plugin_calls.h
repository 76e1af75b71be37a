/* What the parts of kmm._plugin_calls share: libkmm's plugin calls, bound once by bind(). */
#ifndef KMM_PLUGIN_CALLS_H
#define KMM_PLUGIN_CALLS_H

#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* kmm_plugin_alloc and kmm_plugin_free of gen/kmm.h (KmmManager and KmmBuffer are uint64_t,
 * KmmStatus is uint32_t): by buffer handle, so libkmm keeps no table by address for them. */
typedef uint32_t (*plugin_alloc_fn)(uint64_t manager, uint64_t bytes, uint32_t kind, uint64_t stream,
                                    uint64_t *buffer, uint64_t *address);
typedef uint32_t (*plugin_free_fn)(uint64_t manager, uint64_t buffer, uint64_t stream);

#define KMM_OK 0
#define KMM_MEMORY_DEVICE 0

extern plugin_alloc_fn plugin_alloc;
extern plugin_free_fn plugin_free;

/* `o` as a uint64_t in *out; 0 with a ValueError naming `name` when it is not an int in range. */
int as_u64(PyObject *o, const char *name, uint64_t *out);

/* _cupy_calls.c: adds its type and functions to the module; 0 on success. */
int cupy_calls_init(PyObject *module);

#endif
