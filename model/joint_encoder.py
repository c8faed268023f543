"""Joint encoder over transformers' BERT: `[CLS] caption [SEP] <image>xm [SEP]` -> ITM logit.

Image positions carry the adapter output in place of word embeddings and token type 1.
Heads: ITM (BERT pooler + linear -> one logit), MLM (BERT's own LM head, caption tokens only),
text-embedding recovery (text-only [CLS] -> linear -> the backbone's text-embedding width).
`score(texts, image_tokens)` is the one scoring path for training, evaluation and serving.

With `itm_input="global"` (the thesis chapter's feature fusion, a baseline): BERT reads the caption
alone, the image is ONE vector (the mean of the adapter's output tokens), and the ITM logit is an MLP
over [t, v, t*v, |t-v|] of the text [CLS] t and that vector v; MLM fuses v into each caption position's
hidden state just before the LM head. No image token ever enters BERT.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, PreTrainedTokenizerBase
from transformers.models.bert.modeling_bert import BertPooler

from edje.model import wordpieces
from edje.model.content_words import ContentWords, best_cosines, content_word_slots, mean_over_words
from edje.model.pointer import Pointer
from edje.model.relation_roles import MAX_RELATIONS, NUM_ROLES, mention_roles, role_matrix, word_starts
from edje.schemas.config import JointEncoderConfig


@dataclass
class PairBatch:
    """A tokenised batch of (caption, image tokens) pairs, ready for BERT."""

    input_ids: torch.Tensor  # [B, T]; image positions hold pad ids (their embeddings are replaced)
    attention_mask: torch.Tensor  # [B, T]
    token_type_ids: torch.Tensor  # [B, T]
    image_mask: torch.Tensor  # [B, T] bool, exactly m True per row, in order
    text_mask: torch.Tensor  # [B, T] bool, caption wordpieces (no special tokens)
    roles: Optional[torch.Tensor] = None  # [B, T, NUM_ROLES] relation roles of caption positions (relation_roles)
    orders: Optional[torch.Tensor] = None  # [B, MAX_RELATIONS, 2] ORDER of each relation (roles by the rule of English)


class JointEncoder(nn.Module):
    """BERT over caption wordpieces and stored image tokens, with ITM, MLM and recovery heads."""

    def __init__(self, cfg: JointEncoderConfig, tokenizer: Optional[PreTrainedTokenizerBase] = None, load_weights: bool = True):
        super().__init__()
        self.config = cfg
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(cfg.tokenizer or cfg.language_model)
        if cfg.language_model is not None and load_weights:
            self.bert = BertForMaskedLM.from_pretrained(cfg.language_model)
        else:
            bert_cfg = BertConfig(**cfg.bert_config) if cfg.bert_config else BertConfig.from_pretrained(cfg.language_model)
            self.bert = BertForMaskedLM(bert_cfg)
        if self.tokenizer.vocab_size > self.bert.config.vocab_size:
            raise ValueError(f"tokenizer has {self.tokenizer.vocab_size} wordpieces but the BERT vocabulary has "
                             f"{self.bert.config.vocab_size}")
        hidden = self.bert.config.hidden_size
        self.max_length = cfg.max_text_tokens + 3 + cfg.num_image_tokens
        # Caption wordpieces read, when a caller asks for fewer than the checkpoint's max_text_tokens (CrossEncoder's
        # max_length); the image positions do not move, so scores of shorter captions are unchanged by it.
        self.text_limit: Optional[int] = None
        extend_position_embeddings(self.bert, self.max_length)
        if cfg.itm_input == "global":
            self.itm_head = GlobalITMHead(hidden)
        else:
            self.itm_head = nn.Sequential(BertPooler(self.bert.config), nn.Linear(hidden, 1))
        self.recovery_head = nn.Linear(hidden, cfg.text_embed_dim)
        self.word_context = WordContext(hidden, cfg.word_context) if cfg.word_context else None
        self.mlm_fusion = GlobalMLMFusion(hidden) if cfg.itm_input == "global" else None
        # Captions recur across training steps (and queries across requests): tokenise each once.
        self.wordpiece_cache = wordpieces.WordpieceCache()
        layers = self.bert.config.num_hidden_layers
        for name in ("route_layer", "ground_layer"):
            if getattr(cfg, name) > layers:
                raise ValueError(f"{name}={getattr(cfg, name)} but BERT has {layers} layers")
        # What the layer hooks of one forward read and leave: per thread, as serving threads share an encoder.
        self._pass = _PassState()
        if cfg.relation_roles:
            self.role_embedding = nn.Linear(NUM_ROLES, hidden, bias=False)
            nn.init.zeros_(self.role_embedding.weight)  # a new input starts at 0: a warm start is unchanged
            self.role_cache = wordpieces.WordpieceCache()
        if cfg.pointer:
            self.pointer = Pointer(hidden, cfg.num_image_tokens, cfg.pointer_dim, cfg.pointer_inject_std)
        if cfg.route_layer:
            self.route = nn.Linear(hidden, hidden, bias=False)
            nn.init.zeros_(self.route.weight)
            self.bert.bert.encoder.layer[cfg.route_layer - 1].register_forward_hook(self._add_route)
        if cfg.ground_layer:
            self.ground_head = nn.Linear(hidden, 2)
            self.bert.bert.encoder.layer[cfg.ground_layer - 1].register_forward_hook(self._keep_ground_states)
        self._content_words: Optional[ContentWords] = None  # built from the tokenizer on first use
        if cfg.word_alignment:
            if cfg.itm_input == "global":
                raise ValueError("the word-alignment term reads the image tokens: it needs itm_input 'tokens'")
            self.alignment_scale = nn.Parameter(torch.tensor(float(cfg.word_alignment)))

    @property
    def hidden_size(self) -> int:
        return self.bert.config.hidden_size

    @property
    def device(self) -> torch.device:
        return self.recovery_head.weight.device

    @property
    def global_itm(self) -> bool:
        """True when the ITM head reads one global image vector, never the image tokens."""
        return self.config.itm_input == "global"

    # ------------------------------------------------------------ inputs
    def tokenize_pairs(self, texts: Sequence[str], num_image_tokens: int) -> PairBatch:
        """Lay out `[CLS] caption [SEP] <image>xm [SEP] [PAD]...` for each caption."""
        return self._pair_batch(texts, num_image_tokens, torch.device("cpu"))

    def _caption_wordpieces(self, texts: Sequence[str]):
        """Caption wordpieces of each text (no special tokens, truncated), each distinct text tokenised once;
        returns (rows of the distinct texts, inverse index [B])."""
        unique, inverse = wordpieces.distinct(texts)
        n = self.text_limit or self.config.max_text_tokens  # the max_length setter keeps the limit below the ceiling
        tok = self.tokenizer

        def tokenize(batch: List[str]) -> List[List[int]]:
            return tok(batch, add_special_tokens=False, truncation=True, max_length=n)["input_ids"]
        return self.wordpiece_cache.lookup(unique, tokenize, (id(tok), n)), inverse

    def _pair_batch(self, texts: Sequence[str], num_image_tokens: int, device: torch.device) -> PairBatch:
        """The pair layout built once per distinct text on the CPU, then gathered per pair on `device`."""
        rows, inverse = self._caption_wordpieces(texts)
        tok = self.tokenizer
        fields = wordpieces.pair_rows(rows, num_image_tokens, tok.cls_token_id, tok.sep_token_id, tok.pad_token_id)
        if self.config.relation_roles:
            fields = (*fields, *self._role_rows(texts, rows, fields[0].shape[1]))
        return PairBatch(*_gather(fields, inverse, device))

    def _role_rows(self, texts: Sequence[str], rows: List[List[int]], width: int) -> tuple:
        """([U, T, NUM_ROLES] roles of each distinct text's caption positions (1..n),) from the parse of its words,
        plus [U, MAX_RELATIONS, 2] ORDER of its relations when the roles come from the rule of English; `rows` are the
        distinct texts' wordpieces, in first-seen order."""
        unique = list(dict.fromkeys(texts))
        tok = self.tokenizer
        by_rule = self.config.role_vocabulary is None

        def parse(batch: List[str]) -> list:
            if by_rule:
                return [mention_roles(t, tok) for t in batch]
            vocabulary = frozenset(self.config.role_vocabulary)
            return [(role_matrix(t, lambda w: len(tok.tokenize(w)), vocabulary), None) for t in batch]
        out = torch.zeros(len(unique), width, NUM_ROLES)
        orders = torch.zeros(len(unique), MAX_RELATIONS, 2)
        for u, ((matrix, order), pieces) in enumerate(zip(self.role_cache.lookup(unique, parse, id(tok)), rows)):
            n = min(len(matrix), len(pieces))  # truncated captions keep the roles of the pieces they keep
            out[u, 1:1 + n] = torch.from_numpy(matrix[:n])
            if order is not None:
                orders[u] = torch.from_numpy(order)
        return (out, orders) if by_rule else (out,)

    def embed_pairs(self, batch: PairBatch, image_tokens: torch.Tensor) -> torch.Tensor:
        """Word embeddings with the image positions replaced by `image_tokens`."""
        emb = self.bert.get_input_embeddings()(batch.input_ids)
        emb = place_image_tokens(emb, batch.image_mask, image_tokens.to(emb.dtype))
        if self.word_context is not None:
            emb = self.word_context(emb, batch.text_mask)
        if self.config.relation_roles:
            emb = emb + self.role_embedding(batch.roles.to(emb.dtype)) * batch.text_mask[..., None].to(emb.dtype)
        return emb

    def word_positions(self, text: str) -> List[int]:
        """Pair-layout position of each whitespace word's first wordpiece, for the words truncation keeps."""
        n = self.config.max_text_tokens
        return [1 + s for s in word_starts(text, lambda w: len(self.tokenizer.tokenize(w))) if s < n]

    def check_image_tokens(self, texts: Sequence[str], image_tokens: torch.Tensor) -> None:
        """Shape checks that would otherwise surface as a broadcast or a crash deep in torch."""
        if not isinstance(image_tokens, torch.Tensor) or image_tokens.dim() != 3:
            raise ValueError(f"image_tokens must be a [B, m, {self.hidden_size}] tensor, got "
                             f"{getattr(image_tokens, 'shape', type(image_tokens).__name__)}")
        if image_tokens.shape[-1] != self.hidden_size:
            raise ValueError(f"image tokens are {image_tokens.shape[-1]} wide; this joint encoder is {self.hidden_size} wide")
        if image_tokens.shape[0] != len(texts):
            raise ValueError(f"{len(texts)} texts but {image_tokens.shape[0]} token matrices")
        if not image_tokens.is_floating_point():
            raise TypeError(f"image tokens must be floating point, got {image_tokens.dtype}")
        if image_tokens.shape[1] != self.config.num_image_tokens:
            raise ValueError(f"this joint encoder takes {self.config.num_image_tokens} image tokens, got {image_tokens.shape[1]}")
        if any(not isinstance(t, str) for t in texts):
            raise TypeError("texts must be strings")

    # ------------------------------------------------------------ forward
    def encode_pairs(self, texts: Sequence[str], image_tokens: torch.Tensor, input_ids: Optional[torch.Tensor] = None):
        """Run BERT over pairs; returns (sequence output [B, T, h], PairBatch)."""
        self.check_image_tokens(texts, image_tokens)
        batch = self._pair_batch(texts, image_tokens.shape[1], image_tokens.device)
        if input_ids is not None:
            batch.input_ids = input_ids
        return self._encode(batch, image_tokens), batch

    def _encode(self, batch: PairBatch, image_tokens: torch.Tensor) -> torch.Tensor:
        """BERT's sequence output [B, T, h] over a laid-out batch."""
        self._pass.roles = batch.roles
        if self.config.pointer:
            self._pass.pointer = self._pointer_states(batch, image_tokens)
        try:
            out = self.bert.bert(
                inputs_embeds=self.embed_pairs(batch, image_tokens),
                attention_mask=batch.attention_mask,
                token_type_ids=batch.token_type_ids,
                position_ids=self._position_ids(batch),
            )
        finally:
            self._pass.roles = self._pass.pointer = None
        return out.last_hidden_state

    def _position_ids(self, batch: PairBatch) -> Optional[torch.Tensor]:
        """None (BERT's 0..T-1) after the text; with fixed image positions, image token i at
        max_text_tokens + 2 + i and the final [SEP] after them, whatever the caption's length."""
        if self.config.image_positions != "fixed":
            return None
        j = torch.arange(batch.input_ids.shape[1], device=batch.input_ids.device).expand_as(batch.input_ids)
        start = self.config.max_text_tokens + 2
        m = int(batch.image_mask[0].sum())
        pos = torch.where(batch.image_mask, start + batch.image_mask.long().cumsum(1) - 1, j)
        final_sep = j == batch.text_mask.sum(1, keepdim=True) + 2 + m
        return torch.where(final_sep, torch.full_like(pos, start + m), pos)

    def pointer_positions(self, batch: PairBatch, image_tokens: torch.Tensor):
        """(x_hat [B, 2 * MAX_RELATIONS, 2], valid [B, 2 * MAX_RELATIONS]) of each relation's subject (first
        MAX_RELATIONS rows) and object phrase: the pointer over the pass's own input ids, [MASK]ed pieces left out."""
        phrases = phrase_masks(batch.roles)
        readable = phrases * (batch.input_ids != self.tokenizer.mask_token_id)[:, None, :].to(phrases.dtype)
        words = self.bert.get_input_embeddings()(batch.input_ids)
        return self.pointer(words, readable, image_tokens)

    def pointer_readout(self, texts: Sequence[str], image_tokens: torch.Tensor):
        """(x_hat, valid) of `pointer_positions` for (texts[i], image_tokens[i]) pairs (no BERT pass), and each
        caption's relation ORDER [B, MAX_RELATIONS, 2]: what the pointer's order loss reads."""
        if not self.config.pointer:
            raise ValueError("this joint encoder has no pointer (pointer=False)")
        self.check_image_tokens(texts, image_tokens)
        batch = self._pair_batch(texts, image_tokens.shape[1], image_tokens.device)
        return (*self.pointer_positions(batch, image_tokens), batch.orders)

    def _pointer_states(self, batch: PairBatch, image_tokens: torch.Tensor) -> torch.Tensor:
        """[B, T, h]: each phrase piece's share of inject(x_hat) of the phrases it belongs to (0 elsewhere)."""
        xy, valid = self.pointer_positions(batch, image_tokens)
        weights = phrase_masks(batch.roles).to(xy.dtype) * valid[..., None].to(xy.dtype)  # [B, P, T]
        return torch.einsum("bpt,bph->bth", weights, self.pointer.inject(xy)) / weights.sum(1).clamp_min(1)[..., None]

    def _add_route(self, module, inputs, output):
        """Layer hook: each relation word gets route(mean subject state - mean object state) of its relation, after
        the pointer's x_hat (when on) is added to the phrases' states it reads."""
        roles = self._pass.roles
        if roles is None:  # text-only passes carry no roles
            return output
        h = output[0] if isinstance(output, tuple) else output
        if self._pass.pointer is not None:
            h = h + self._pass.pointer.to(h.dtype)
        roles = roles.to(h.dtype)
        rel, sub, obj = roles[..., 0::3], roles[..., 1::3], roles[..., 2::3]  # [B, T, relations]

        def mean(weights: torch.Tensor) -> torch.Tensor:
            return torch.einsum("btk,bth->bkh", weights, h) / weights.sum(1).clamp_min(1)[..., None]
        route_input = mean(sub) - mean(obj)  # [B, relations, h]
        if self._pass.want_route:  # only score_and_route reads it; other passes keep nothing alive
            self._pass.route_inputs = route_input
            self._pass.route_valid = (rel.sum(1) > 0) & (sub.sum(1) > 0) & (obj.sum(1) > 0)
        h = h + torch.einsum("btk,bkh->bth", rel, self.route(route_input))
        return (h, *output[1:]) if isinstance(output, tuple) else h

    def _keep_ground_states(self, module, inputs, output):
        if self._pass.want_ground:  # only score_and_ground reads them; other passes keep nothing alive
            self._pass.ground_states = output[0] if isinstance(output, tuple) else output

    def score_and_ground(self, texts: Sequence[str], image_tokens: torch.Tensor):
        """(ITM logits [B], predicted object centre [B, T, 2] of every position after `ground_layer` layers)."""
        if not self.config.ground_layer:
            raise ValueError("this joint encoder has no grounding head (ground_layer=0)")
        self._pass.want_ground = True
        try:
            hidden, batch = self.encode_pairs(texts, image_tokens)
        finally:
            self._pass.want_ground = False
        states, self._pass.ground_states = self._pass.ground_states, None
        return self._itm(hidden, batch, image_tokens), self.ground_head(states)

    def score_and_route(self, texts: Sequence[str], image_tokens: torch.Tensor):
        """(ITM logits [B], route inputs [B, R, h], valid [B, R]): what the route reads for each of the R relation
        slots, mean(subject states) - mean(object states) at `route_layer` (after the pointer's addition, when on), and
        whether the slot has a relation word and non-empty subject and object phrases."""
        if not self.config.route_layer:
            raise ValueError("this joint encoder has no route (route_layer=0)")
        self._pass.want_route = True
        try:
            hidden, batch = self.encode_pairs(texts, image_tokens)
            inputs, valid = self._pass.route_inputs, self._pass.route_valid
        finally:
            self._pass.want_route = False
            self._pass.route_inputs = self._pass.route_valid = None
        return self._itm(hidden, batch, image_tokens), inputs, valid

    def score(self, texts: Sequence[str], image_tokens: torch.Tensor) -> torch.Tensor:
        """ITM logits [B] for pairs (texts[i], image_tokens[i]); the one scoring path."""
        if self.global_itm:
            self.check_image_tokens(texts, image_tokens)
            # BERT runs once per distinct caption (a query repeated over its k candidates runs once).
            input_ids, attention, inverse = self._text_inputs(texts, image_tokens.device, per_pair=False)
            hidden = self._text_hidden(input_ids, attention, self._caption_positions(input_ids, attention))
            return self.itm_head(hidden[:, 0][inverse.to(hidden.device)], global_image_vector(image_tokens))
        hidden, batch = self.encode_pairs(texts, image_tokens)
        return self._itm(hidden, batch, image_tokens)

    forward = score

    def _itm(self, hidden: torch.Tensor, batch: PairBatch, image_tokens: torch.Tensor) -> torch.Tensor:
        """The ITM logits [B] of a pass: the head over the pair's [CLS], plus the word-alignment term (read from the
        pass's own layout) when on."""
        logits = self.itm_head(hidden).squeeze(-1)
        if self.config.word_alignment:
            vecs, valid = self._word_vectors(batch)
            logits = logits + self.alignment_scale * mean_over_words(best_cosines(vecs, image_tokens, paired=True), valid)
        return logits

    def content_word_vectors(self, texts: Sequence[str], num_image_tokens: int,
                             device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """Each caption's content words (model/content_words.py, a rule of English), each the mean of its wordpieces'
        input-embedding rows [B, W, h] (no position or token type embedding), and which of the W slots are words
        [B, W]."""
        return self._word_vectors(self._pair_batch(list(texts), num_image_tokens, device))

    def _word_vectors(self, pairs: PairBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        """`content_word_vectors` of a laid-out batch."""
        if self._content_words is None:
            self._content_words = ContentWords(self.tokenizer)
        slots = content_word_slots(self._content_words, pairs.input_ids, pairs.text_mask)
        embedding = self.bert.get_input_embeddings()
        # One-hot of each caption position's word slot; slot -1 (no content word) falls in column 0, dropped.
        pieces = F.one_hot(slots + 1, int(slots.max()) + 2)[..., 1:].to(embedding.weight.dtype)
        count = pieces.sum(1)
        vecs = torch.einsum("btw,bth->bwh", pieces, embedding(pairs.input_ids)) / count.clamp_min(1)[..., None]
        return vecs, count > 0

    def word_alignment(self, texts: Sequence[str], image_tokens: torch.Tensor) -> torch.Tensor:
        """[B] for pairs (texts[i], image_tokens[i]): the mean over the caption's content words of each word's best
        cosine over the image's tokens (FILIP's late interaction, on the encoder's own word embeddings)."""
        vecs, valid = self.content_word_vectors(texts, image_tokens.shape[1], image_tokens.device)
        return mean_over_words(best_cosines(vecs, image_tokens, paired=True), valid)

    def mlm_logits(self, texts: Sequence[str], image_tokens: torch.Tensor, mask_prob: float = 0.5,
                   generator: Optional[torch.Generator] = None,
                   mask_policy: Optional[Callable[[PairBatch, Optional[torch.Generator]], torch.Tensor]] = None):
        """Mask `mask_prob` of caption wordpieces (never special or image tokens), or the positions
        `mask_policy(batch, generator)` picks among them; returns (logits, labels)."""
        self.check_image_tokens(texts, image_tokens)
        if self.global_itm:
            return self._global_mlm_logits(texts, image_tokens, mask_prob, generator, mask_policy)
        batch = self._pair_batch(texts, image_tokens.shape[1], image_tokens.device)
        if mask_policy is not None:
            masked = batch.text_mask & mask_policy(batch, generator)
        else:
            draw = torch.rand(batch.input_ids.shape, generator=generator).to(image_tokens.device)
            masked = batch.text_mask & (draw < mask_prob)
        labels = torch.where(masked, batch.input_ids, torch.full_like(batch.input_ids, -100))
        input_ids = torch.where(masked, torch.full_like(batch.input_ids, self.tokenizer.mask_token_id), batch.input_ids)
        hidden = self._encode(replace(batch, input_ids=input_ids), image_tokens)
        # Only caption positions carry labels, so the (vocab-wide) LM head runs on those alone.
        sel = batch.text_mask
        return self.bert.cls(hidden[sel]), labels[sel]

    def _global_mlm_logits(self, texts, image_tokens, mask_prob, generator, mask_policy):
        """MLM of the global mode: BERT over the masked caption alone; each caption position's hidden state
        is fused with its pair's global image vector just before the LM head (the image never enters BERT)."""
        input_ids, attention, _ = self._text_inputs(texts, image_tokens.device, per_pair=True)
        text_mask = self._caption_positions(input_ids, attention)
        # The masking policies read a PairBatch: a text-only one (no image positions) with the same fields.
        batch = PairBatch(input_ids, attention, torch.zeros_like(input_ids), torch.zeros_like(text_mask), text_mask)
        if mask_policy is not None:
            masked = text_mask & mask_policy(batch, generator)
        else:
            draw = torch.rand(input_ids.shape, generator=generator).to(image_tokens.device)
            masked = text_mask & (draw < mask_prob)
        labels = torch.where(masked, input_ids, torch.full_like(input_ids, -100))
        masked_ids = torch.where(masked, torch.full_like(input_ids, self.tokenizer.mask_token_id), input_ids)
        hidden = self._text_hidden(masked_ids, attention, text_mask)
        # The (vocab-wide) LM head runs on the masked positions alone: the only ones with labels.
        sel = masked
        rows = torch.arange(len(texts), device=hidden.device)[:, None].expand_as(sel)[sel]
        fused = self.mlm_fusion(hidden[sel], global_image_vector(image_tokens)[rows])
        return self.bert.cls(fused), labels[sel]

    def _text_inputs(self, texts: Sequence[str], device: torch.device, per_pair: bool):
        """`[CLS] caption [SEP] [PAD]...` ids and attention: one row per text (per_pair) or per distinct text;
        returns (input_ids, attention, inverse index [B] into the rows)."""
        rows, inverse = self._caption_wordpieces(texts)
        tok = self.tokenizer
        fields = wordpieces.text_rows(rows, tok.cls_token_id, tok.sep_token_id, tok.pad_token_id)
        if per_pair:
            input_ids, attention = _gather(fields, inverse, device)
            return input_ids, attention, torch.arange(len(texts))
        input_ids, attention = (f.to(device) for f in fields)
        return input_ids, attention, inverse

    def _caption_positions(self, input_ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        tok = self.tokenizer
        return attention.bool() & (input_ids != tok.cls_token_id) & (input_ids != tok.sep_token_id)

    def _text_hidden(self, input_ids: torch.Tensor, attention: torch.Tensor, text_mask: torch.Tensor) -> torch.Tensor:
        """BERT's sequence output over text-only rows (token type 0), word context on caption positions."""
        emb = self.bert.get_input_embeddings()(input_ids)
        if self.word_context is not None:
            emb = self.word_context(emb, text_mask)
        return self.bert.bert(inputs_embeds=emb, attention_mask=attention,
                              token_type_ids=torch.zeros_like(input_ids)).last_hidden_state

    def text_embedding(self, texts: Sequence[str]) -> torch.Tensor:
        """Text-only [CLS] -> recovery head: predicted backbone text embedding [B, text_embed_dim]."""
        rows, inverse = self._caption_wordpieces(texts)
        tok = self.tokenizer
        input_ids, attention = _gather(wordpieces.text_rows(rows, tok.cls_token_id, tok.sep_token_id, tok.pad_token_id),
                                       inverse, self.device)
        emb = self.bert.get_input_embeddings()(input_ids)
        if self.word_context is not None:
            specials = (input_ids == tok.cls_token_id) | (input_ids == tok.sep_token_id)
            emb = self.word_context(emb, attention.bool() & ~specials)
        out = self.bert.bert(inputs_embeds=emb, attention_mask=attention, token_type_ids=torch.zeros_like(input_ids))
        return self.recovery_head(out.last_hidden_state[:, 0])


def phrase_masks(roles: torch.Tensor) -> torch.Tensor:
    """[B, 2 * MAX_RELATIONS, T] pieces of each relation's subject phrase, then of each one's object phrase."""
    return torch.cat([roles[..., 1::3], roles[..., 2::3]], dim=-1).transpose(1, 2)


def global_image_vector(image_tokens: torch.Tensor) -> torch.Tensor:
    """The one image vector of the global mode: the mean of the adapter's output tokens [B, m, h] -> [B, h].
    The backbone's own pooled embedding is a function of the mean of its tokens (fc_norm + head over the
    average); here the trainable adapter shapes each token before the same average, as the thesis's trainable
    image tower shapes its [I_CLS]. A mean is blind to the tokens' order: no token-level access."""
    return image_tokens.mean(dim=1)


class GlobalITMHead(nn.Module):
    """Feature fusion (thesis chapter, with its 2-layer FFN head, and the usual [u, v, u*v, |u-v|] matching
    features): LayerNorm both vectors, concatenate [t, v, t*v, |t-v|] -> Linear(4h, 4h) -> GELU -> Linear(4h, 1)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.text_norm = nn.LayerNorm(hidden)
        self.image_proj = nn.Linear(hidden, hidden)
        self.image_norm = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(4 * hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, 1))

    def forward(self, text_cls: torch.Tensor, image_vector: torch.Tensor) -> torch.Tensor:
        t = self.text_norm(text_cls)
        v = self.image_norm(self.image_proj(image_vector.to(t.dtype)))
        return self.mlp(torch.cat([t, v, t * v, (t - v).abs()], dim=-1)).squeeze(-1)


class GlobalMLMFusion(nn.Module):
    """The global mode's MLM conditioning: h + MLP([h, v]) at each caption position, before BERT's LM head.
    The last layer starts at zero, so the MLM starts text-only and learns what to read from the image vector."""

    def __init__(self, hidden: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(2 * hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))
        nn.init.zeros_(self.mlp[2].weight)
        nn.init.zeros_(self.mlp[2].bias)

    def forward(self, hidden: torch.Tensor, image_vector: torch.Tensor) -> torch.Tensor:
        return hidden + self.mlp(torch.cat([hidden, image_vector.to(hidden.dtype)], dim=-1))


class WordContext(nn.Module):
    """Each caption word's input embedding plus a learned mix of its neighbours' (1-D convolution over
    caption positions only; image and special tokens neither give nor take). Zero-initialised, so a
    model starts as plain BERT and learns how much word order to fold in."""

    def __init__(self, hidden: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv1d(hidden, hidden, kernel, padding=kernel // 2)
        nn.init.zeros_(self.conv.weight)
        nn.init.zeros_(self.conv.bias)

    def forward(self, emb: torch.Tensor, text_mask: torch.Tensor) -> torch.Tensor:
        keep = text_mask.unsqueeze(-1).to(emb.dtype)
        mixed = self.conv((emb * keep).transpose(1, 2)).transpose(1, 2)
        return emb + mixed * keep


def extend_position_embeddings(bert: BertForMaskedLM, target: int) -> None:
    """Grow BERT's learned position table to `target` rows, repeating the last trained row."""
    emb = bert.bert.embeddings
    old = emb.position_embeddings
    n, h = old.weight.shape
    if n >= target:
        return
    new = nn.Embedding(target, h).to(old.weight.device, old.weight.dtype)
    with torch.no_grad():
        new.weight[:n] = old.weight
        new.weight[n:] = old.weight[-1]
    emb.position_embeddings = new
    emb.register_buffer("position_ids", torch.arange(target).unsqueeze(0), persistent=False)
    if hasattr(emb, "token_type_ids"):
        emb.register_buffer("token_type_ids", torch.zeros(1, target, dtype=torch.long), persistent=False)
    bert.config.max_position_embeddings = target


def place_image_tokens(emb: torch.Tensor, image_mask: torch.Tensor, image_tokens: torch.Tensor) -> torch.Tensor:
    """`emb` [B, T, h] with each row's image positions (one run of m, as the pair layout makes them) set to
    `image_tokens` [B, m, h]; writes into `emb`."""
    if emb.device.type != "cpu":  # on an accelerator masked_scatter is fast and needs no host sync
        return emb.masked_scatter(image_mask.unsqueeze(-1).expand_as(emb), image_tokens)
    # On a CPU masked_scatter costs more than the rest of the layout together; rows whose image run
    # starts at the same position (all of them, when one query is repeated) take one slice copy.
    m = image_tokens.shape[1]
    start = image_mask.to(torch.uint8).argmax(dim=1)
    if bool((start == start[0]).all()):
        emb[:, int(start[0]):int(start[0]) + m] = image_tokens
        return emb
    for s in torch.unique(start).tolist():  # at most max_text_tokens + 1 distinct starts
        rows = (start == s).nonzero().squeeze(1)
        emb[rows, s:s + m] = image_tokens[rows]
    return emb


def _gather(rows: Sequence[torch.Tensor], inverse: torch.Tensor, device: torch.device) -> List[torch.Tensor]:
    """Per-pair tensors from per-distinct-text ones: moved to `device` first (U rows, not B), then indexed."""
    if len(inverse) == len(rows[0]):  # every text distinct: `inverse` is the identity
        return [r.to(device) for r in rows]
    inverse = inverse.to(device)
    return [r.to(device)[inverse] for r in rows]


def _to(batch: PairBatch, device: torch.device) -> PairBatch:
    fields = (getattr(batch, f) for f in PairBatch.__dataclass_fields__)
    return PairBatch(*(f.to(device) if f is not None else None for f in fields))


class _PassState(threading.local):
    """Per-thread scratch of one forward (the batch's roles, the grounding layer's states, the route's inputs); copies
    start empty."""

    roles: Optional[torch.Tensor] = None
    pointer: Optional[torch.Tensor] = None  # the pointer's addition to the phrases' states at the route layer
    ground_states: Optional[torch.Tensor] = None
    want_ground: bool = False
    route_inputs: Optional[torch.Tensor] = None  # [B, relations, h] mean(subject) - mean(object) the route read
    route_valid: Optional[torch.Tensor] = None  # [B, relations] slots with a relation word and both phrases
    want_route: bool = False

    def __reduce__(self):
        return (_PassState, ())
