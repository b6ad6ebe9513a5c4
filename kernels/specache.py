"""SpeCache's importance scoring on a 2-bit key copy (KIVI style: per channel, groups of 64 tokens).

    quantize_keys_2bit(k, group=64) -> QuantKeys(codes uint8 [B, H, T/4, d], scale, zero [B, H, T/group, d])
        codes pack 4 consecutive tokens per byte (2 bits each); key ~ zero + scale * code.
    dequantize_keys(qk) -> [B, H, T, d]
    specache_scores(q, qk) -> probs [B, nq, H, T] fp32: max over the GQA group of softmax_t(q . k~_t / sqrt(d))
    specache_scores_ref(q, qk)                          twin: dequantize in fp32, then the same softmax/max
Torch implementation (the issue allows it when measured): scores are q.zero + (q*scale).code per
group, so the codes are unpacked once in the query dtype and never rescaled element-wise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ddbench.core.errors import DDBenchError


@dataclass(frozen=True)
class QuantKeys:
    codes: torch.Tensor  # uint8 [B, H, T // 4, d]
    scale: torch.Tensor  # [B, H, T // group, d]
    zero: torch.Tensor   # [B, H, T // group, d]
    group: int

    @property
    def tokens(self) -> int:
        return self.codes.shape[2] * 4


def quantize_keys_2bit(k: torch.Tensor, group: int = 64) -> QuantKeys:
    if k.dim() != 4 or k.shape[2] % group or group % 4:
        raise DDBenchError(f"keys must be [B, H, T, d] with T a multiple of group={group}")
    B, H, T, d = k.shape
    kg = k.float().view(B, H, T // group, group, d)
    lo, hi = kg.amin(3), kg.amax(3)
    scale = ((hi - lo) / 3).clamp_min(1e-8)
    code = ((kg - lo[:, :, :, None]) / scale[:, :, :, None]).round_().clamp_(0, 3).to(torch.uint8)
    c = code.view(B, H, T // 4, 4, d)
    packed = c[:, :, :, 0] | (c[:, :, :, 1] << 2) | (c[:, :, :, 2] << 4) | (c[:, :, :, 3] << 6)
    return QuantKeys(packed.contiguous(), scale.to(k.dtype), lo.to(k.dtype), group)


def _unpack(codes: torch.Tensor, dtype) -> torch.Tensor:
    B, H, T4, d = codes.shape
    shifts = torch.arange(0, 8, 2, device=codes.device, dtype=torch.uint8).view(1, 1, 1, 4, 1)
    return ((codes[:, :, :, None] >> shifts) & 3).to(dtype).view(B, H, T4 * 4, d)


def dequantize_keys(qk: QuantKeys, dtype=torch.float32) -> torch.Tensor:
    B, H, T, d = qk.codes.shape[0], qk.codes.shape[1], qk.tokens, qk.codes.shape[3]
    c = _unpack(qk.codes, torch.float32).view(B, H, T // qk.group, qk.group, d)
    return (qk.zero.float()[:, :, :, None] + qk.scale.float()[:, :, :, None] * c).view(B, H, T, d).to(dtype)


def _group_softmax_max(s: torch.Tensor, B, nq, H, G) -> torch.Tensor:
    return s.float().softmax(-1).view(B, nq, H, G, -1).amax(3)


def specache_scores(q: torch.Tensor, qk: QuantKeys) -> torch.Tensor:
    B, nq, Hq, d = q.shape
    H = qk.codes.shape[1]
    if Hq % H or qk.codes.shape[0] != B or qk.codes.shape[3] != d:
        raise DDBenchError("q does not match the quantized keys")
    G, ng = Hq // H, qk.tokens // qk.group
    qh = q.view(B, nq, H, G, d).permute(0, 2, 1, 3, 4).reshape(B, H, nq * G, d)  # [B, H, M, d]
    codes = _unpack(qk.codes, q.dtype).view(B, H, ng, qk.group, d)
    qs = qh[:, :, None] * qk.scale[:, :, :, None]                              # [B, H, ng, M, d]
    s = torch.matmul(qs, codes.transpose(-1, -2))                              # [B, H, ng, M, group]
    s = s.float() + torch.matmul(qh[:, :, None], qk.zero[:, :, :, :, None]).float()  # + q.zero per group
    s = s.permute(0, 3, 1, 2, 4).reshape(B, nq, G, H, qk.tokens).transpose(2, 3).reshape(B, nq * H * G, -1)
    return _group_softmax_max(s / math.sqrt(d), B, nq, H, G)


def specache_scores_ref(q: torch.Tensor, qk: QuantKeys) -> torch.Tensor:
    B, nq, Hq, d = q.shape
    H = qk.codes.shape[1]
    k = dequantize_keys(qk).repeat_interleave(Hq // H, 1)  # [B, Hq, T, d]
    s = torch.einsum("bthd,bhsd->bths", q.float(), k) / math.sqrt(d)
    return _group_softmax_max(s, B, nq, H, Hq // H)
