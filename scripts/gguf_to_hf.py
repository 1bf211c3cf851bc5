"""Convert the embedded model's GGUF into a transformers folder (vLLM 0.32 serves folders, not GGUF files).

    python scripts/gguf_to_hf.py MODEL.gguf OUT_DIR        # needs torch, transformers, gguf, accelerate

The weights are dequantised to bfloat16; the tokenizer and chat template come from the GGUF itself, so
nothing is fetched from a hub.
"""

import sys
import time
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
start = time.time()
tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="bfloat16")
model.hf_quantizer = None  # the weights are plain tensors now; saving must not describe them as quantised
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
tokenizer.save_pretrained(out)
print(f"converted in {time.time() - start:.0f}s -> {out}")
