"""The embedded model cut to its first N decoder blocks, for the GPU check's search section.

The embedded GGUF (SmolLM2-135M Q4_1, 94 MiB) cannot travel to a lent GPU: a device call
carries 64 MiB in all. This keeps its tokenizer, metadata, Q8_0 token embedding (tied output)
and final norm, and blocks 0..N-1 byte for byte, with `llama.block_count = N`: the same
architecture, tensor types and code paths, fewer blocks. Needs the `gguf` package.

    python benchmarks/gpu_model.py SRC.gguf DST.gguf --blocks 4
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def truncate_gguf(src: Path, dst: Path, blocks: int) -> dict[str, int]:
    """Write `src` with only its first `blocks` decoder blocks to `dst` (atomically).

    Returns {"blocks": kept, "of": total, "bytes": size of dst}.

    Raises:
        ValueError: `blocks` is not between 1 and the model's block count, or no block count.
    """
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    count_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    if count_key not in reader.fields:
        raise ValueError(f"{src} has no {count_key}: not a decoder GGUF")
    total = int(reader.fields[count_key].contents())
    if not 1 <= blocks <= total:
        raise ValueError(f"--blocks must be 1..{total} for {src.name}, got {blocks}")
    tmp = dst.with_name(dst.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer adds these itself
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = blocks if field.name == count_key else field.contents()
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    kept = [t for t in reader.tensors
            if not (m := _BLOCK.match(t.name)) or int(m.group(1)) < blocks]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    tmp.replace(dst)
    return {"blocks": blocks, "of": total, "bytes": dst.stat().st_size}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--blocks", type=int, default=4)
    args = ap.parse_args(argv)
    if not args.src.is_file():
        print(f"error: no GGUF at {args.src}", file=sys.stderr)
        return 2
    try:
        got = truncate_gguf(args.src, args.dst, args.blocks)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.dst}: {got['blocks']} of {got['of']} blocks, {got['bytes'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
