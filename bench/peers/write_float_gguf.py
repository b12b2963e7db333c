"""A GGUF file with its quantized matrices dequantised and stored as F16 (or BF16 / F32), or re-quantized into
another 32-weight block type by gguf.quants (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: e.g. the Q5_0 that llama.cpp writes for
most of a small model's Q4_K_M file): the default model in another type, for measuring how pagedcore and
llama.cpp run it (the values are the source file's dequantised blocks; 1-D tensors stay as stored). Metadata and
tensor order are copied.

    .venv/bin/python bench/peers/write_float_gguf.py /tmp/smollm2-135m-f16.gguf [--type F16|BF16|F32|Q5_0|...]
                                                     [--src FILE]
"""

import argparse

import numpy as np

# --type -> gguf.LlamaFileType member of the written file
_FILE_TYPES = {"F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16", "F32": "ALL_F32", "Q8_0": "MOSTLY_Q8_0",
               "Q4_0": "MOSTLY_Q4_0", "Q4_1": "MOSTLY_Q4_1", "Q5_0": "MOSTLY_Q5_0", "Q5_1": "MOSTLY_Q5_1"}


def main() -> None:
    import gguf
    from gguf import GGMLQuantizationType as T

    from pagedcore.loader.source import default_model_path

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--type", choices=[*_FILE_TYPES], default="F16")
    parser.add_argument("--src", default=None, help="the source GGUF (default: the bundled default model)")
    args = parser.parse_args()
    target = T[args.type]
    reader = gguf.GGUFReader(args.src or default_model_path())
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(args.out, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            continue  # (the new file's is set below)
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), val_type, sub_type=sub_type)
    writer.add_file_type(getattr(gguf.LlamaFileType, _FILE_TYPES[args.type]))
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # float32, numpy row-major shape
        if len(tensor.shape) > 1 and tensor.tensor_type != target:  # a matrix: re-stored as the target type
            if target in (T.F16, T.F32):
                data = values.astype(np.float16) if target == T.F16 else values.astype(np.float32)
            else:  # BF16 and the block types: gguf's reference quantizer (uint8 rows of blocks)
                data = gguf.quants.quantize(values.astype(np.float32), target)
            writer.add_tensor(tensor.name, data, raw_dtype=target)
        else:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print("wrote", args.out)


if __name__ == "__main__":
    main()
