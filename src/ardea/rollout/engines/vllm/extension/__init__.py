"""Code that runs inside a vLLM server, not in ardea: put this folder on the server's
``PYTHONPATH`` (ardea need not be installed in vLLM's environment; see
:mod:`ardea.rollout.engines.vllm.extension.ardea_weights`)."""

from pathlib import Path

#: the folder a vLLM server's PYTHONPATH names for ``--worker-extension-cls``
FOLDER = Path(__file__).parent
#: the value of the server's ``--worker-extension-cls``
WORKER_EXTENSION = "ardea_weights.WeightUpload"
