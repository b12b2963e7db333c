#!/usr/bin/env sh
# Fails if an object of the linear kernels compiled with AVX flags (linear_avx2.o, linear_avx512*.o)
# defines a weak symbol outside its own ISA namespace: the linker keeps one copy of each inline
# function, and an AVX-512 copy of a shared helper would crash (SIGILL) on a CPU without AVX-512.
# (check_isa_symbols.sh does the same for the attention objects.)
#   usage: check_linear_isa_symbols.sh "obj1;obj2;..."   (CMake's $<TARGET_OBJECTS:pagedcore_kernels>)
set -eu
NM=${NM:-nm}
status=0
checked=0
old_ifs=$IFS
IFS=';'
for obj in $1; do
  case "$(basename "$obj")" in
    linear_avx2*.o|linear_avx512*.o) ;;
    *) continue ;;
  esac
  checked=$((checked + 1))
  bad=$("$NM" -C "$obj" | grep -E ' [WVu] ' | grep -v -E 'kernels::linear_(avx2|avx512|avx512_bf16dot)::|DW\.ref\.' || true)
  if [ -n "$bad" ]; then
    echo "$obj defines shared weak symbols (move them into the ISA namespace):"
    echo "$bad"
    status=1
  fi
done
IFS=$old_ifs
echo "checked $checked AVX linear object(s)"
[ "$checked" -gt 0 ] || { echo "no linear_avx*.o among the objects"; exit 1; }
exit $status
