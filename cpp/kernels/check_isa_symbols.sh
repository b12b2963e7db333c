#!/usr/bin/env sh
# Fails if an object compiled with AVX flags (attention_avx2.o, attention_avx512.o) defines a weak
# symbol outside its own ISA namespace: the linker keeps one copy of each inline function, and an
# AVX-512 copy of a shared helper would crash (SIGILL) on a CPU without AVX-512.
#   usage: check_isa_symbols.sh "obj1;obj2;..."   (CMake's $<TARGET_OBJECTS:pagedcore_kernels>)
set -eu
NM=${NM:-nm}
status=0
checked=0
old_ifs=$IFS
IFS=';'
for obj in $1; do
  case "$(basename "$obj")" in
    attention_avx2*.o|attention_avx512*.o) ;;
    *) continue ;;
  esac
  checked=$((checked + 1))
  bad=$("$NM" -C "$obj" | grep -E ' [WVu] ' | grep -v -E 'kernels::(avx2|avx512|VecAvx2|VecAvx512)::|DW\.ref\.' || true)
  if [ -n "$bad" ]; then
    echo "$obj defines shared weak symbols (move them into the ISA namespace):"
    echo "$bad"
    status=1
  fi
done
IFS=$old_ifs
echo "checked $checked AVX object(s)"
exit $status
