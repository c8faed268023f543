"""Binding and relation lab (scratch harness, in-process): train a joint encoder on perfect scene tokens with
family-twin negatives and read within-family accuracy on a validation world.

Not a product path; the winning levers move into training/ as named options.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edje.evaluation.scene_pairs import side_of
from edje.model.relation_roles import NUM_ROLES, role_matrix
from edje.sampleworld.captions import COLOUR_WORDS, SHAPE_WORDS, SIZE_WORDS, article
from edje.sampleworld.scene import Scene
from edje.sampleworld.scene_tokens import SCENE_TOKENS_BACKBONE, SceneTokenConfig, SceneTokenizer
from edje.sampleworld.world import WorldConfig, sample_records
from edje.schemas.token_table import TableMetadata
from edje.training.config import ModelSpec
from edje.training.losses import itm_loss
from edje.training.model_init import build_model


def group_vocab(tokenizer):
    """wordpiece id -> (group, canonical value)."""
    out = {}
    for group, table in (("colour", COLOUR_WORDS), ("shape", SHAPE_WORDS), ("size", SIZE_WORDS)):
        for value, words in table.items():
            for w in words:
                for piece in tokenizer.tokenize(w):
                    out.setdefault(tokenizer.convert_tokens_to_ids(piece), (group, value))
    rel_words = {"left": "left", "right": "right", "above": "above", "over": "above", "below": "below",
                 "beneath": "below", "under": "below", "top": "above", "bottom": "below"}
    for w, v in rel_words.items():
        out[tokenizer.convert_tokens_to_ids(w)] = ("relation", v)
    return out


class LateHead(nn.Module):
    """Token-level late interaction: each caption token's best-matching image token, gated mean."""

    def __init__(self, hidden: int, dim: int = 64):
        super().__init__()
        self.q, self.k, self.gate = nn.Linear(hidden, dim), nn.Linear(hidden, dim), nn.Linear(hidden, 1)
        self.out = nn.Linear(1, 1)
        self.dim = dim

    def forward(self, hidden, text_mask, image_mask):
        b = hidden.shape[0]
        m = int(image_mask[0].sum())
        img = hidden[image_mask].view(b, m, -1)
        sim = torch.einsum("btd,bmd->btm", self.q(hidden), self.k(img)) / math.sqrt(self.dim)
        best = sim.max(dim=-1).values  # [B, T]
        g = torch.sigmoid(self.gate(hidden).squeeze(-1)) * text_mask
        s = (g * best).sum(1) / g.sum(1).clamp_min(1e-6)
        return self.out(s[:, None]).squeeze(-1)


@dataclass
class LabConfig:
    train_seed: int = 100
    n_train: int = 12000
    n_val: int = 500
    same_side_rate: float = 0.0  # share of two-object families with both objects on one side (train and val)
    steps: int = 600
    families: int = 8
    lr: float = 1e-3
    warmup: int = 50
    adapter: str = "local"
    num_queries: int = 16
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    dropout: float = 0.0
    mlm: str = "groups"  # none | random | groups
    mlm_weight: float = 1.0
    head: str = "cls"  # cls | late | both
    itm_weight: float = 1.0
    single_steps: int = 0
    adapter_position: str = "none"
    text_conv: int = 0  # 1: neighbouring caption words mixed into each word's input embedding (kernel 3)
    kernel: int = 3  # word-context kernel width when text_conv is on
    fixed_image_pos: int = 0  # 1: image cells get position ids independent of caption length
    rel_boost: float = 1.0  # weight of the relation group when picking the group to mask
    ground_weight: float = 0.0  # >0: each shape word regresses its object's centre (x, y) from its final hidden state
    pos_curriculum: int = 0  # 1: one-object phase places the object left/right/top/bottom and says so ("on the left")
    roles: int = 0  # 1: role embeddings (subject / object / relation, per relation) from a parse of spatial prepositions
    pos2_steps: int = 0  # after the one-object stage: steps of two-object captions naming each object's side
    route_diag: int = 0  # 1 (needs roles): DIAGNOSTIC, the parse routes subject minus object states to the relation word
    route_layer: int = 2
    ground_layer: int = 0  # >0: grounding reads the hidden state after this many layers (0: the final one)
    lm_layers: int = 0  # >0: the packaged MiniLM's first N layers (pretrained) instead of a random BERT
    eval_every: int = 100
    threads: int = 2
    seed: int = 0
    out: str = ""


def main():
    p = argparse.ArgumentParser()
    for f, v in asdict(LabConfig()).items():
        p.add_argument("--" + f.replace("_", "-"), type=type(v), default=v)
    cfg = LabConfig(**vars(p.parse_args()))
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    rng = np.random.default_rng(cfg.seed)
    recs = sample_records(WorldConfig(seed=cfg.train_seed, n_train=cfg.n_train, n_val=cfg.n_val, n_test=0,
                                      same_side_rate=cfg.same_side_rate))
    st = SceneTokenizer(SceneTokenConfig())
    toks = torch.from_numpy(st.batch([r.scene for r in recs]))
    fam = {}
    for i, r in enumerate(recs):
        fam.setdefault((r.split, r.family_id), []).append(i)
    train_f = [v for (s, _), v in fam.items() if s == "train" and len(v) == 4]
    val_f = [v for (s, _), v in fam.items() if s == "val" and len(v) == 4]
    meta = TableMetadata(kind="raw", backbone=SCENE_TOKENS_BACKBONE, pretrained=st.cfg.pretrained_tag,
                         feature_layer="final", num_tokens=64, width=128, quantization="fp16", embed_dim=16)
    spec = ModelSpec(adapter=cfg.adapter, num_queries=cfg.num_queries, adapter_hidden=512, adapter_heads=4,
                     adapter_position=cfg.adapter_position,
                     encoder_layers=cfg.lm_layers or None,
                     bert_config=None if cfg.lm_layers else (("hidden_size", cfg.hidden), ("num_hidden_layers", cfg.layers),
                                  ("num_attention_heads", cfg.heads), ("intermediate_size", 4 * cfg.hidden),
                                  ("hidden_dropout_prob", cfg.dropout), ("attention_probs_dropout_prob", cfg.dropout)))
    model = build_model(spec, meta)
    enc = model.encoder
    late = LateHead(enc.hidden_size) if cfg.head in ("late", "both") else None
    params = list(model.parameters()) + (list(late.parameters()) if late else [])
    if cfg.text_conv:
        conv = nn.Conv1d(enc.hidden_size, enc.hidden_size, cfg.kernel, padding=cfg.kernel // 2)
        nn.init.zeros_(conv.weight)
        nn.init.zeros_(conv.bias)
        params += list(conv.parameters())
        plain = enc.embed_pairs

        def embed_pairs(batch, image_tokens):
            emb = plain(batch, image_tokens)
            words = emb * batch.text_mask[..., None]
            mixed = conv(words.transpose(1, 2)).transpose(1, 2)
            return emb + mixed * batch.text_mask[..., None]
        enc.embed_pairs = embed_pairs
    if cfg.fixed_image_pos:
        def _encode(batch, image_tokens):
            T = batch.input_ids.shape[1]
            m = image_tokens.shape[1]
            base = torch.arange(T)[None, :].expand(batch.input_ids.shape[0], T).clone()
            start = enc.config.max_text_tokens + 2
            img_pos = start + torch.arange(m)
            pos = base.clone()
            pos[batch.image_mask] = img_pos.repeat(batch.input_ids.shape[0])
            after = batch.attention_mask.bool() & ~batch.image_mask & ~batch.text_mask & (base > 0)
            # the final [SEP] (after the image run) gets start + m; the middle [SEP] keeps its text position
            n_text = batch.text_mask.sum(1, keepdim=True)
            final_sep = after & (base > n_text + 1)
            pos[final_sep] = start + m
            pos = pos.clamp_max(enc.bert.bert.embeddings.position_embeddings.num_embeddings - 1)
            out = enc.bert.bert(inputs_embeds=enc.embed_pairs(batch, image_tokens), attention_mask=batch.attention_mask,
                                token_type_ids=batch.token_type_ids, position_ids=pos)
            return out.last_hidden_state
        enc._encode = _encode
        _plain_encode_pairs = enc.encode_pairs
        def encode_pairs(texts, image_tokens, input_ids=None):
            batch = enc._pair_batch(texts, image_tokens.shape[1], image_tokens.device)
            if input_ids is not None:
                batch.input_ids = input_ids
            return enc._encode(batch, image_tokens), batch
        enc.encode_pairs = encode_pairs
    if cfg.roles:
        role_emb = nn.Linear(NUM_ROLES, enc.hidden_size, bias=False)
        nn.init.zeros_(role_emb.weight)  # a new gain starts at 0
        params += list(role_emb.parameters())
        tok = enc.tokenizer
        roles_of = {}
        last_roles = {}
        before_roles = enc.embed_pairs

        def embed_with_roles(batch, image_tokens):
            emb = before_roles(batch, image_tokens)
            r = torch.zeros(emb.shape[0], emb.shape[1], NUM_ROLES)
            for b, text in enumerate(current_texts):
                if text not in roles_of:
                    roles_of[text] = torch.from_numpy(role_matrix(text, lambda w: len(tok.tokenize(w))))
                m = roles_of[text][: int(batch.text_mask[b].sum())]
                r[b, 1:1 + len(m)] = m
            last_roles["r"] = r
            return emb + role_emb(r) * batch.text_mask[..., None]
        enc.embed_pairs = embed_with_roles
        plain_encode_pairs = enc.encode_pairs
        current_texts = []

        def encode_pairs_tracking(texts, image_tokens, input_ids=None):
            current_texts[:] = list(texts)
            return plain_encode_pairs(texts, image_tokens, input_ids=input_ids)
        enc.encode_pairs = encode_pairs_tracking
    ground = nn.Linear(enc.hidden_size, 2)
    if cfg.ground_weight > 0:
        params += list(ground.parameters())
    mid = {}
    if cfg.route_diag:
        # DIAGNOSTIC (parse-given routing): after layer `route_layer`, each relation word receives
        # P(mean of its subject's states - mean of its object's states), P learned from zero. If relations
        # are learned with this path, what fails without it is the relation word finding its nouns.
        route = nn.Linear(enc.hidden_size, enc.hidden_size, bias=False)
        nn.init.zeros_(route.weight)
        params += list(route.parameters())

        def add_route(mod, inp, out):
            h = out[0] if isinstance(out, tuple) else out
            r = last_roles["r"]
            extra = torch.zeros_like(h)
            for k in range(NUM_ROLES // 3):
                rel, sub, obj = r[..., 3 * k], r[..., 3 * k + 1], r[..., 3 * k + 2]
                ms = (sub[..., None] * h).sum(1) / sub.sum(1, keepdim=True).clamp_min(1)
                mo = (obj[..., None] * h).sum(1) / obj.sum(1, keepdim=True).clamp_min(1)
                extra = extra + rel[..., None] * route(ms - mo)[:, None, :]
            h = h + extra
            return (h,) + tuple(out[1:]) if isinstance(out, tuple) else h
        enc.bert.bert.encoder.layer[cfg.route_layer - 1].register_forward_hook(add_route)
    if cfg.ground_layer:
        enc.bert.bert.encoder.layer[cfg.ground_layer - 1].register_forward_hook(
            lambda mod, inp, out: mid.__setitem__("h", out[0] if isinstance(out, tuple) else out))
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.05)
    gv = group_vocab(enc.tokenizer)
    gid = torch.full((enc.tokenizer.vocab_size + 10,), -1, dtype=torch.long)
    groups = ["colour", "shape", "size", "relation"]
    for t, (g, _) in gv.items():
        gid[t] = groups.index(g)
    canon = {t: v for t, (g, v) in gv.items()}

    def score(texts, img):
        hidden, batch = enc.encode_pairs(texts, img)
        if cfg.head == "cls":
            return enc.itm_head(hidden).squeeze(-1)
        li = late(hidden, batch.text_mask, batch.image_mask)
        return li if cfg.head == "late" else li + enc.itm_head(hidden).squeeze(-1)

    group_cands = [torch.tensor(sorted(t for t, (gg, _) in gv.items() if gg == grp)) for grp in groups]

    def masked_forward(texts, img, pick):
        """Mask all words of group pick[i] in caption i; (hidden at masked, labels, row of each, group of each)."""
        batch = enc.tokenize_pairs(texts, img.shape[1])
        ids = batch.input_ids
        g = gid[ids.clamp_max(len(gid) - 1)]
        masked = batch.text_mask & (g == pick[:, None])
        inp = torch.where(masked, torch.full_like(ids, enc.tokenizer.mask_token_id), ids)
        hidden, _ = enc.encode_pairs(texts, img, input_ids=inp)
        rows = torch.arange(len(texts))[:, None].expand_as(ids)[masked]
        return enc.bert.cls(hidden[masked]), ids[masked], rows

    def mlm_score(texts, img):
        """Sum over attribute groups of log p(true words | that group masked, image), group-restricted softmax."""
        batch = enc.tokenize_pairs(texts, img.shape[1])
        g = gid[batch.input_ids.clamp_max(len(gid) - 1)]
        total = torch.zeros(len(texts))
        for k in range(4):
            has = (g == k).any(1)
            if not has.any():
                continue
            pick = torch.where(has, torch.full((len(texts),), k), torch.full((len(texts),), -5))
            logits, lab, rows = masked_forward(texts, img, pick)
            cand = group_cands[k]
            lp = torch.log_softmax(logits[:, cand], -1)
            pos = (lab[:, None] == cand[None, :]).float().argmax(1)
            total.index_add_(0, rows, lp[torch.arange(len(lab)), pos])
        return total

    rel_acc = []

    def mlm(texts, img):
        batch = enc.tokenize_pairs(texts, img.shape[1])
        ids = batch.input_ids
        g = gid[ids.clamp_max(len(gid) - 1)]
        if cfg.mlm == "random":
            masked = batch.text_mask & (torch.rand(ids.shape) < 0.5)
        else:
            # one attribute group per caption, all its words
            present = torch.stack([(g == k).any(1) for k in range(4)], 1).float() + 1e-9
            present[:, 3] *= cfg.rel_boost
            pick = torch.multinomial(present, 1).squeeze(1)
            masked = batch.text_mask & (g == pick[:, None])
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        inp = torch.where(masked, torch.full_like(ids, enc.tokenizer.mask_token_id), ids)
        hidden, _ = enc.encode_pairs(texts, img, input_ids=inp)
        logits = enc.bert.cls(hidden[masked])
        lab = labels[masked]
        loss = F.cross_entropy(logits, lab) if len(lab) else logits.sum() * 0
        # binding read-out: argmax within the group's own words, synonyms as one
        with torch.no_grad():
            acc = []
            rel_acc.clear()
            for row, label in zip(logits, lab.tolist()):
                grp = gv.get(label, (None,))[0]
                if grp is None:
                    continue
                cand = [t for t, (gg, _) in gv.items() if gg == grp]
                best = cand[int(row[cand].argmax())]
                acc.append(canon[best] == canon[label])
                if grp == "relation":
                    rel_acc.append(canon[best] == canon[label])
        return loss, (float(np.mean(acc)) if acc else float("nan"))

    @torch.no_grad()
    def evaluate():
        model.eval()
        if late:
            late.eval()
        t2i = i2t = n = 0
        for s in range(0, len(val_f), 32):
            fs = val_f[s:s + 32]
            idx = [i for f in fs for i in f]
            img = model.adapter(toks[idx])  # [4F, m, h]
            texts, imgs = [], []
            for f_i, f in enumerate(fs):
                for a in range(4):
                    for b in range(4):  # caption of a vs image b
                        texts.append(recs[f[a]].captions[0])
                        imgs.append(img[4 * f_i + b])
            sc = (score(texts, torch.stack(imgs)) if cfg.itm_weight > 0 else mlm_score(texts, torch.stack(imgs))).view(len(fs), 4, 4)
            t2i += int((sc.argmax(2) == torch.arange(4)).sum())
            i2t += int((sc.argmax(1) == torch.arange(4)).sum())
            n += 4 * len(fs)
        # binding read-out on val: each group masked whole, argmax within the group, synonyms as one
        idx = [f[0] for f in val_f[:100]] + [f[1] for f in val_f[:100]]
        texts = [recs[i].captions[0] for i in idx]
        img = model.adapter(toks[idx])
        bind = {}
        for k, grp in enumerate(groups):
            logits, lab, rows = masked_forward(texts, img, torch.full((len(texts),), k))
            if len(lab):
                cand = group_cands[k]
                best = cand[logits[:, cand].argmax(1)]
                bind[grp] = round(float(np.mean([canon[int(a)] == canon[int(b)] for a, b in zip(best, lab)])), 3)
        # relation read-out on every val member's first caption, split by how far back the subject's shape word is
        idx = [i for f in val_f for i in f]
        texts = [recs[i].captions[0] for i in idx]
        img = model.adapter(toks[idx])
        batch = enc.tokenize_pairs(texts, img.shape[1])
        logits, lab, rows = masked_forward(texts, img, torch.full((len(texts),), 3))
        ids = batch.input_ids
        g = gid[ids.clamp_max(len(gid) - 1)]
        cand = group_cands[3]
        best = cand[logits[:, cand].argmax(1)]
        ok = [canon[int(a)] == canon[int(b)] for a, b in zip(best, lab)]
        # distance of each masked relation word back to the nearest shape piece
        dists = []
        for r in range(len(texts)):
            row = ids[r].tolist()
            for j in range(len(row)):
                if batch.text_mask[r, j] and g[r, j] == 3:
                    d = next((j - q for q in range(j - 1, 0, -1) if gid[min(row[q], len(gid) - 1)] == 1), 99)
                    dists.append(d)
        assert len(dists) == len(ok), (len(dists), len(ok))
        split = {}
        for name, sel in (("d1", lambda d: d == 1), ("d2-4", lambda d: 2 <= d <= 4), ("d5+", lambda d: d >= 5)):
            v = [o for o, d in zip(ok, dists) if sel(d)]
            if v:
                split[name] = (round(float(np.mean(v)), 3), len(v))
        # both objects on one side of the centre: the subject's side alone does not give the relation
        def side(scene):
            if len(scene.objects) != 2:
                return "3 objects"
            return side_of(scene, 0 if scene.relations[0].predicate in ("left_of", "right_of") else 1)
        sides = [side(recs[idx[r]].scene) for r in rows.tolist()]
        for name in ("same side", "both sides"):
            v = [o for o, sd in zip(ok, sides) if sd == name]
            if v:
                split[name] = (round(float(np.mean(v)), 3), len(v))
        bind["relation_split"] = split
        model.train()
        if late:
            late.train()
        return t2i / n, i2t / n, bind

    def pick_word(words):
        return words[int(rng.integers(len(words)))]

    log = []
    t0 = time.time()
    sums = {}
    for step in range(1, cfg.steps + 1):
        lr = cfg.lr * min(1, step / cfg.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1, step / cfg.steps))))
        for gp in opt.param_groups:
            gp["lr"] = lr
        fs = [train_f[i] for i in rng.choice(len(train_f), cfg.families, replace=False)]
        idx = [i for f in fs for i in f]
        ci = rng.integers(0, 5, len(fs))
        caps = [recs[i].captions[ci[j // 4]] for j, i in enumerate(idx)]
        if step <= cfg.single_steps:  # curriculum: one object per scene, "a large red circle"
            objs = [recs[i].scene.objects[int(rng.integers(len(recs[i].scene.objects)))] for i in idx]
            caps = [article(f"{pick_word(SIZE_WORDS[o.size])} {pick_word(COLOUR_WORDS[o.colour])} "
                            f"{pick_word(SHAPE_WORDS[o.shape])}") for o in objs]
            if cfg.pos_curriculum:
                from dataclasses import replace as _replace

                from edje.sampleworld.captions import SIDE
                offs = {"left_of": (-0.25, 0.0), "right_of": (0.25, 0.0), "above": (0.0, -0.25), "below": (0.0, 0.25)}
                sides = [list(offs)[int(rng.integers(4))] for _ in objs]
                objs = [_replace(o, center=(0.5 + offs[sd][0] + float(rng.uniform(-0.05, 0.05)),
                                            0.5 + offs[sd][1] + float(rng.uniform(-0.05, 0.05)))) for o, sd in zip(objs, sides)]
                caps = [f"{c} {SIDE[sd]}" for c, sd in zip(caps, sides)]
            raw = torch.from_numpy(st.batch([Scene((o,), recs[0].scene.background) for o in objs]))
        elif step <= cfg.single_steps + cfg.pos2_steps:
            # middle stage: each of two objects named with its own side ("a red circle on the left and a blue
            # square on the right"), from the scene's first relation; one-object scenes keep their caption
            from edje.sampleworld.captions import SIDE
            from edje.sampleworld.scene import INVERSE

            def named(o):
                return article(f"{pick_word(SIZE_WORDS[o.size])} {pick_word(COLOUR_WORDS[o.colour])} "
                               f"{pick_word(SHAPE_WORDS[o.shape])}")
            for j, i in enumerate(idx):
                sc = recs[i].scene
                if sc.relations:
                    r = sc.relations[0]
                    a, b = named(sc.objects[r.subject]), named(sc.objects[r.object])
                    caps[j] = f"{a} {SIDE[r.predicate]} and {b} {SIDE[INVERSE[r.predicate]]}"
            raw = toks[idx]
        else:
            raw = toks[idx]
        img = model.adapter(raw)
        B = len(idx)
        # twins: the 3 other members of the family, same caption index (same words, other binding)
        others = torch.tensor([[4 * (j // 4) + o for o in range(4) if o != j % 4] for j in range(B)])
        texts = caps + [caps[j] for j in range(B) for _ in range(3)] + [caps[o] for j in range(B) for o in others[j].tolist()]
        imgs = torch.cat([img, img[others.reshape(-1)], img.repeat_interleave(3, 0)])
        loss, out = 0.0, {}
        if cfg.itm_weight > 0 and step > cfg.single_steps:
            logits = score(texts, imgs)
            pos, ni, nt = logits[:B], logits[B:B + 3 * B].view(B, 3), logits[B + 3 * B:].view(B, 3)
            loss_itm = itm_loss(pos, ni, nt)
            acc = float(torch.cat([pos > ni.max(1).values, pos > nt.max(1).values]).float().mean())
            loss = cfg.itm_weight * loss_itm
            out = {"itm": float(loss_itm), "acc": acc}
        if cfg.mlm != "none":
            lm, macc = mlm(caps, img)
            loss = loss + cfg.mlm_weight * lm
            out.update(mlm=float(lm), mlm_bind=macc)
            if rel_acc:
                out.update(mlm_rel=float(np.mean(rel_acc)))
        if cfg.ground_weight > 0 and step > cfg.single_steps:
            hidden_g, batch_g = enc.encode_pairs(caps, img)
            ids_g = batch_g.input_ids
            gg = gid[ids_g.clamp_max(len(gid) - 1)]
            sel = batch_g.text_mask & (gg == 1)
            rows_g, cols_g = sel.nonzero(as_tuple=True)
            targets = []
            for r_, c_ in zip(rows_g.tolist(), cols_g.tolist()):
                val = canon[int(ids_g[r_, c_])]
                obj = next(o for o in recs[idx[r_]].scene.objects if o.shape == val)
                targets.append([obj.center[0] - 0.5, obj.center[1] - 0.5])
            if targets:
                pred = ground((mid["h"] if cfg.ground_layer else hidden_g)[rows_g, cols_g])
                lg = F.mse_loss(pred, torch.tensor(targets)) * 10
                loss = loss + cfg.ground_weight * lg
                out.update(ground=float(lg))
        if cfg.itm_weight > 0 and step <= cfg.single_steps and cfg.mlm == "none":
            continue
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 5.0)
        opt.step()
        for k, v in out.items():
            if not (isinstance(v, float) and math.isnan(v)):
                sums.setdefault(k, []).append(v)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            t2i, i2t, bind = evaluate()
            row = {"step": step, "min": round((time.time() - t0) / 60, 2), **{k: round(float(np.mean(v)), 3) for k, v in sums.items()},
                   "val_t2i": round(t2i, 3), "val_i2t": round(i2t, 3), "val_bind": bind}
            sums = {}
            log.append(row)
            print(json.dumps(row), flush=True)
    if cfg.out:
        json.dump({"config": asdict(cfg), "log": log}, open(cfg.out, "w"))


if __name__ == "__main__":
    main()
