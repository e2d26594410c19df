"""Snakemake's own executor-plugin test workflows (simple, groups) on the local Modal
server, through the installed client."""

from __future__ import annotations

import pytest
import snakemake.common.tests

from snakemake_executor_plugin_modal import ExecutorSettings

from .helpers import spawned


class TestWorkflows(snakemake.common.tests.TestWorkflowsBase):
    __test__ = True

    @pytest.fixture(autouse=True)
    def _server(self, modal_server):
        self.server = modal_server

    def get_executor(self) -> str:
        return "modal"

    def get_executor_settings(self):
        return ExecutorSettings(gpu="L4", volume="plugin-tests")

    def get_assume_shared_fs(self) -> bool:
        return False

    def get_default_storage_provider(self):
        return None

    def get_default_storage_prefix(self):
        return None

    def get_default_storage_provider_settings(self):
        return None

    def test_group_workflow(self, tmp_path):
        super().test_group_workflow(tmp_path)
        calls = spawned(self.server)
        # rules a and b of each sample form one group job: 3 groups + rule c
        assert len(calls) == 4, [c["function"] for c in calls]
        assert {c["status"] for c in calls} == {"GENERIC_STATUS_SUCCESS"}
        out = tmp_path / "groups" / "test3.out"
        assert out.exists()
