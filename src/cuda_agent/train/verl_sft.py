"""verl's multi-turn SFT dataset for the RFT parquet: the `tools` column holds JSON text (tool
schemas differ in structure, which one parquet column type cannot hold without filling every
schema with the others' fields as nulls); this subclass decodes it. rft.sh selects it with
`data.custom_cls.path` / `data.custom_cls.name`."""

from __future__ import annotations

import json

from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset


class CudaAgentSFTDataset(MultiTurnSFTDataset):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if getattr(self, "tools", None) is not None:
            self.tools = [json.loads(t) if isinstance(t, str) else t for t in self.tools]
