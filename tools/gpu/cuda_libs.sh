# Sourced on the GPU machine. cudarc looks for unversioned libnvrtc.so / libcublas.so (or up to
# .12); CUDA 13 ships .so.13, so link them under the names cudarc tries. cuSOLVER (the compression
# basis of matching) loads cuSPARSE and nvJitLink by their versioned names from its own folder.
libs=/tmp/kmm-cudalibs
mkdir -p "$libs"
for name in nvrtc cublas cublasLt nvrtc-builtins cusolver cusparse; do
  found=$(find / \( -path /proc -o -path /sys \) -prune -o -name "lib$name.so.1[0-9]*" -print 2>/dev/null | sort | tail -1)
  [ -n "$found" ] && ln -sf "$found" "$libs/lib$name.so"
done
export LD_LIBRARY_PATH=$libs:$(dirname "$(readlink -f "$libs/libnvrtc.so")"):$(dirname "$(readlink -f "$libs/libcusolver.so")"):${LD_LIBRARY_PATH:-}
