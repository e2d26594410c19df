"""
The scenario of a run: which (encoder, area) configurations, which test images, which
estimator settings, and where every file lives. The value is
`multigeom_workflow.scenario.model` (`Configuration`, `Scenario`); reading and checking
it from the workflow's configuration is `multigeom_workflow.scenario.load`.
"""

from .load import ConfigError, load_scenario, validated_scenario
from .model import Configuration, Scenario

__all__ = [
    "ConfigError",
    "Configuration",
    "Scenario",
    "load_scenario",
    "validated_scenario",
]
