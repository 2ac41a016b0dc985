"""NxD's ``neuronx_distributed.pipeline.manual_pipe_stage``: not provided (importing it says why)."""

from nxd_compat.surface import refuse_module

refuse_module(__name__, "NxD's FX-traced pipeline engine; nxd-pipeline cuts a model through its declared nxd_pipeline_* methods or its transformers layout and schedules it itself: use neuronx_distributed.pipeline.NxDPPModel (docs/pipeline.md)")
