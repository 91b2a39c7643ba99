"""verl's multi-turn SFT dataset for the RFT parquet (rft.sh selects it with `data.custom_cls.path` /
`data.custom_cls.name`).

verl's own `MultiTurnSFTDataset` renders every message by itself through the chat template and
checks that the pieces joined equal the whole conversation rendered at once. For this project's
episodes that fails twice over: Qwen-style templates group consecutive tool messages into one
turn (rendered alone, each gets its own, and the check raises on every episode with two calls in a
turn), and rendering the messages again re-tokenises the model's text, which need not give the
tokens the model sampled. The RFT parquet therefore carries each episode's own tokens
(`input_ids`: prompt + response, `loss_mask`: 1 on the model's tokens, as `response_mask`), and this
dataset trains on exactly those: the tokens SFT trains on are the tokens RL sampled, observations
excluded from the loss. Rows without them (a parquet from elsewhere) go through verl's rendering.
The `tools` column holds JSON text (tool schemas differ in structure, which one parquet column type
cannot hold), decoded here.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset


class CudaAgentSFTDataset(MultiTurnSFTDataset):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if getattr(self, "tools", None) is not None:
            self.tools = [json.loads(t) if isinstance(t, str) else t for t in self.tools]
        columns = set(self.dataframe.columns)
        self.has_tokens = {"input_ids", "loss_mask"} <= columns

    def __getitem__(self, item):
        if not self.has_tokens:
            return super().__getitem__(item)
        row = self.dataframe.iloc[item]
        input_ids = torch.tensor(list(row["input_ids"]), dtype=torch.long)
        loss_mask = torch.tensor(list(row["loss_mask"]), dtype=torch.long)
        if input_ids.shape != loss_mask.shape or not len(input_ids):
            raise ValueError(f"RFT row {item}: {len(input_ids)} input_ids and {len(loss_mask)} loss_mask entries")
        return self._shape(item, input_ids, loss_mask)

    def _shape(self, item: int, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> dict:
        """The sample in the layout verl's SFT trainer expects of its pad mode (as the parent
        builds it). Episodes are never cut: one over max_length is an error whatever `truncation`
        says, since a cut episode would train on a turn without its end."""
        n = len(input_ids)
        if n > self.max_length:
            raise ValueError(f"RFT row {item}: {n} tokens, over data.max_length={self.max_length} (raise it to the "
                             "rollout's prompt + response length)")
        position_ids = torch.arange(n, dtype=torch.long)
        if self.pad_mode == "no_padding":
            return {"input_ids": input_ids, "position_ids": position_ids, "loss_mask": loss_mask}
        pad = self.max_length - n
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return {"input_ids": F.pad(input_ids, (0, pad), value=pad_id),
                "attention_mask": F.pad(torch.ones(n, dtype=torch.long), (0, pad), value=0),
                "position_ids": F.pad(position_ids, (0, pad), value=0),
                "loss_mask": F.pad(loss_mask, (0, pad), value=0)}
