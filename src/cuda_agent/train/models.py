"""Loading the learner's models as the settings say: dtype, gradient checkpointing, LoRA, a separate
or shared critic, the frozen KL reference; from a base folder or a checkpoint; and the pre-flight
memory check that refuses a run which cannot fit before anything is loaded.

A checkpoint's `actor/` is a full `save_pretrained` folder, or with LoRA an adapter folder
(`adapter_config.json`) that is loaded back onto the base model (`model`): the base is the one
thing a LoRA run never writes, and the KL reference is that base with the adapter disabled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .config import LoraConfig, TrainConfig
from .learner import Learner, ValueHead, is_peft

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class ModelError(ValueError):
    """Models that cannot be loaded as configured (the stages raise it as a StageError)."""


def _checkpointing(model, on: bool) -> None:
    if on:
        # non-reentrant: works with frozen inputs (LoRA's frozen embeddings) without input grads
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.chat_template is None:
        raise ModelError(f"{path}: the tokenizer has no chat template")
    return tok


def apply_lora(model, lora: LoraConfig):
    """The model wrapped by peft with adapters on `lora.target_modules`; a target no linear module of
    the model is named is an error that lists the names there are."""
    from peft import LoraConfig as PeftLora
    from peft import get_peft_model

    names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    missing = [t for t in lora.target_modules if t not in names]
    if missing:
        raise ModelError(f"lora.target_modules {missing} name no linear module of {type(model).__name__}; "
                         f"its linear modules: {', '.join(names)}")
    conf = PeftLora(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                    target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, conf)


def load_actor(path: Path, device: str, *, dtype: torch.dtype = torch.float32, checkpointing: bool = False,
               lora: LoraConfig | None = None, adapter: Path | None = None):
    """(model, tokenizer): the causal LM at `path`; with `adapter` (a LoRA checkpoint) its trained
    adapter on top, with `lora` fresh adapters (B = 0: the model starts as the base)."""
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(adapter or path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    _checkpointing(model, checkpointing)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    elif lora is not None:
        model = apply_lora(model, lora)
    return model, tok


def load_critic(path: Path, device: str, *, dtype: torch.dtype = torch.float32, checkpointing: bool = False):
    """An AutoModelForTokenClassification with one output: verl's critic checkpoint format. From a
    causal LM's folder the value head is new (zero-initialised, so values start at 0)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    conf = AutoConfig.from_pretrained(path)
    new_head = not any("TokenClassification" in a for a in (conf.architectures or []))
    critic = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, dtype=dtype).to(device)
    _checkpointing(critic, checkpointing)
    # the token-classification head's dropout (0.1 by default) would make the values of the update
    # differ from the old values computed in eval mode, and the value clip act on noise
    for m in critic.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    if new_head:
        head = getattr(critic, "score", None) or getattr(critic, "classifier", None)
        if head is not None:
            torch.nn.init.zeros_(head.weight)
            if getattr(head, "bias", None) is not None:
                torch.nn.init.zeros_(head.bias)
    return critic


def load_value_head(actor, source: Path | None) -> ValueHead:
    """The shared critic's head on the actor's device: from `source` (a folder holding
    value_head.pt, or its critic/ subfolder) or new."""
    head = ValueHead(actor.config.hidden_size).to(next(actor.parameters()).device)
    if source is not None:
        for f in (Path(source) / "value_head.pt", Path(source) / "critic" / "value_head.pt"):
            if f.exists():
                head.load_state_dict(torch.load(f, weights_only=True, map_location="cpu"))
                return head
        raise ModelError(f"{source}: no value_head.pt (critic_mode shared loads the head a shared-critic run "
                         f"wrote to OUT/final/critic)")
    return head


def load_reference(path: Path, device: str, dtype: torch.dtype):
    """The frozen KL reference: the base model, in eval mode and without gradients."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    ref.requires_grad_(False)
    return ref


@dataclass
class Sources:
    """Where a stage's models come from: the base model (always: LoRA's base, the reference), the
    checkpoint to resume (or None), the critic to start from (cfg.critic, or None)."""
    base: Path
    ckpt: Path | None
    critic: Path | None


def build_learner(cfg: TrainConfig, src: Sources, *, critic: bool, ref: bool, allowed_fn=None) -> Learner:
    """The learner of a stage: actor (with its adapter or fresh LoRA), the critic of `critic_mode` when
    `critic`, the frozen reference when `ref` and no LoRA; optimiser state restored from the checkpoint."""
    dtype, dev, ckpt = DTYPES[cfg.dtype_name], cfg.train_device, src.ckpt
    adapter = ckpt / "actor" if ckpt is not None and (ckpt / "actor" / "adapter_config.json").exists() else None
    if ckpt is not None and adapter is None:
        actor, tok = load_actor(ckpt / "actor", dev, dtype=dtype, checkpointing=cfg.checkpointing)
        if cfg.lora is not None:
            raise ModelError(f"{ckpt}: a full-parameter checkpoint, but lora is set; resume without lora")
    else:
        actor, tok = load_actor(src.base, dev, dtype=dtype, checkpointing=cfg.checkpointing, lora=cfg.lora,
                                adapter=adapter)
    sep = head = None
    if critic and cfg.critic_mode == "separate":
        start = ckpt / "critic" if ckpt is not None and (ckpt / "critic" / "config.json").exists() else None
        sep = load_critic(start or src.critic or src.base, dev, dtype=dtype, checkpointing=cfg.checkpointing)
    elif critic:
        start = ckpt / "critic" if ckpt is not None and (ckpt / "critic" / "value_head.pt").exists() else None
        head = load_value_head(actor, start or src.critic)
    reference = load_reference(src.base, dev, dtype) if ref and not is_peft(actor) else None
    allowed = allowed_fn(tok) if allowed_fn is not None else None
    learner = Learner(actor, tok, sep, cfg.optim, temperature=cfg.episode.temperature, allowed=allowed,
                      value_head=head, ref=reference, chunk=cfg.logprob_chunk, seed=cfg.seed)
    if ckpt is not None:
        learner.load_optim(ckpt)
    return learner


def preflight(cfg: TrainConfig, base: Path, *, critic: bool, ref: bool) -> str | None:
    """On CUDA: a description of the estimated need when it exceeds the device's memory, else None
    (and None on the CPU, whose memory is the operating system's business)."""
    if not cfg.on_cuda or not torch.cuda.is_available():
        return None
    from transformers import AutoConfig

    from .memory import estimate

    conf = AutoConfig.from_pretrained(base)
    lora = cfg.lora.model_dump() if cfg.lora is not None else None
    est = estimate(conf, dtype_bytes=2 if cfg.dtype_name == "bf16" else 4, micro_batch=cfg.optim.micro_batch,
                   seq_len=cfg.episode.context_tokens, checkpointing=cfg.checkpointing, lora=lora,
                   separate_critic=critic and cfg.critic_mode == "separate",
                   ref_copy=ref and cfg.lora is None, chunk=cfg.logprob_chunk)
    have = torch.cuda.get_device_properties(torch.device(cfg.train_device)).total_memory
    if est.total <= have:
        return None
    return (f"training would need {est.describe()} for micro_batch {cfg.optim.micro_batch} x "
            f"{cfg.episode.context_tokens} tokens, precision {cfg.dtype_name}, gradient checkpointing "
            f"{'on' if cfg.checkpointing else 'off'}, critic {cfg.critic_mode if critic else 'none'}; "
            f"{cfg.train_device} has {have / 1024 ** 3:.1f} GiB. Lower optim.micro_batch or "
            f"episode.context_tokens, or set precision=bf16, gradient_checkpointing=true, critic_mode=shared, lora")
