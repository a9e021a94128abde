"""``ironbatch simulate``: vLLM 0.33's exact scheduling of a request trace
(the Rust core's decisions) on a step-time model's clock, at thousands of
times real time; workload readers, step-time models, the summary, the HTML
report and configuration sweeps. ``ironbatch.simulate`` is ``simulate``
here (the package is ``simulation`` so that the function keeps the name).
``SAMPLE_TRACE`` is the path of a small Azure-trace slice shipped with the
package (300 requests); ``simulate("sample")`` reads it."""

from ironbatch.simulation.load import SAMPLE_TRACE, load_workload
from ironbatch.simulation.run import SimulationResult, simulate
from ironbatch.simulation.step_model import StepModel, load_step_model
from ironbatch.simulation.synthetic import SyntheticSpec, synthetic_workload
from ironbatch.simulation.workload import Workload

__all__ = [
    "SAMPLE_TRACE",
    "SimulationResult",
    "StepModel",
    "SyntheticSpec",
    "Workload",
    "load_step_model",
    "load_workload",
    "simulate",
    "synthetic_workload",
]
