"""The joint encoder's input layout as it was before the packed pair layout, kept verbatim as a reference.

`benchmarks/pair_layout_bench.py` times it beside today's path, and `tests/test_pair_layout.py`
checks that today's path gives bit-identical batches and equal scores.
"""
from __future__ import annotations

from typing import Sequence

import torch

from edje.model.joint_encoder import JointEncoder, PairBatch, _to


def legacy_tokenize_pairs(enc: JointEncoder, texts: Sequence[str], num_image_tokens: int) -> PairBatch:
    """Lay out `[CLS] caption [SEP] <image>xm [SEP] [PAD]...` for each caption, one Python row at a time."""
    tok = enc.tokenizer
    ids = tok(list(texts), add_special_tokens=False, truncation=True, max_length=enc.config.max_text_tokens)["input_ids"]
    m = num_image_tokens
    lengths = [len(t) + 3 + m for t in ids]
    T = max(lengths)
    b = len(ids)
    input_ids = torch.full((b, T), tok.pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, T), dtype=torch.long)
    types = torch.zeros((b, T), dtype=torch.long)
    image_mask = torch.zeros((b, T), dtype=torch.bool)
    text_mask = torch.zeros((b, T), dtype=torch.bool)
    for i, t in enumerate(ids):
        n = len(t)
        input_ids[i, 0] = tok.cls_token_id
        input_ids[i, 1:n + 1] = torch.tensor(t, dtype=torch.long)
        input_ids[i, n + 1] = tok.sep_token_id
        input_ids[i, n + 2 + m] = tok.sep_token_id
        text_mask[i, 1:n + 1] = True
        image_mask[i, n + 2:n + 2 + m] = True
        types[i, n + 2:n + 3 + m] = 1
        attention[i, :lengths[i]] = 1
    return PairBatch(input_ids, attention, types, image_mask, text_mask)


def legacy_embed_pairs(enc: JointEncoder, batch: PairBatch, image_tokens: torch.Tensor) -> torch.Tensor:
    """The old `embed_pairs`: word embeddings, image positions replaced by masked_scatter."""
    emb = enc.bert.get_input_embeddings()(batch.input_ids)
    mask = batch.image_mask.unsqueeze(-1).expand_as(emb)
    return emb.masked_scatter(mask, image_tokens.to(emb.dtype))


def legacy_score(enc: JointEncoder, texts: Sequence[str], image_tokens: torch.Tensor) -> torch.Tensor:
    """ITM logits through the old layout (the old `score`: check, layout, BERT, ITM head)."""
    enc.check_image_tokens(texts, image_tokens)
    batch = _to(legacy_tokenize_pairs(enc, texts, image_tokens.shape[1]), image_tokens.device)
    out = enc.bert.bert(inputs_embeds=legacy_embed_pairs(enc, batch, image_tokens), attention_mask=batch.attention_mask,
                        token_type_ids=batch.token_type_ids)
    return enc.itm_head(out.last_hidden_state).squeeze(-1)


def legacy_text_inputs(enc: JointEncoder, texts: Sequence[str]):
    """The old text-only inputs of `text_embedding`: (input_ids, attention_mask)."""
    t = enc.tokenizer(list(texts), truncation=True, max_length=enc.config.max_text_tokens + 2, padding=True,
                      return_tensors="pt")
    return t["input_ids"], t["attention_mask"]


def legacy_mlm_logits(enc: JointEncoder, texts: Sequence[str], image_tokens: torch.Tensor, mask_prob: float = 0.5,
                      generator=None):
    """The old `mlm_logits` (layout twice: once for the mask, once inside the forward)."""
    batch = _to(legacy_tokenize_pairs(enc, texts, image_tokens.shape[1]), image_tokens.device)
    draw = torch.rand(batch.input_ids.shape, generator=generator).to(image_tokens.device)
    masked = batch.text_mask & (draw < mask_prob)
    labels = torch.where(masked, batch.input_ids, torch.full_like(batch.input_ids, -100))
    input_ids = torch.where(masked, torch.full_like(batch.input_ids, enc.tokenizer.mask_token_id), batch.input_ids)
    again = _to(legacy_tokenize_pairs(enc, texts, image_tokens.shape[1]), image_tokens.device)
    again.input_ids = input_ids
    hidden = enc.bert.bert(inputs_embeds=legacy_embed_pairs(enc, again, image_tokens), attention_mask=again.attention_mask,
                           token_type_ids=again.token_type_ids).last_hidden_state
    sel = batch.text_mask
    return enc.bert.cls(hidden[sel]), labels[sel]


def legacy_text_embedding(enc: JointEncoder, texts: Sequence[str]) -> torch.Tensor:
    """The old `text_embedding`."""
    input_ids, attention = legacy_text_inputs(enc, texts)
    out = enc.bert.bert(input_ids=input_ids, attention_mask=attention, token_type_ids=torch.zeros_like(input_ids))
    return enc.recovery_head(out.last_hidden_state[:, 0])
