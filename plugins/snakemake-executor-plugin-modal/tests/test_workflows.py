"""Snakemake's own executor-plugin test workflows (simple, groups) on the fake Modal."""

from __future__ import annotations

import pytest
import snakemake.common.tests

from snakemake_executor_plugin_modal import ExecutorSettings


class TestWorkflows(snakemake.common.tests.TestWorkflowsBase):
    __test__ = True

    @pytest.fixture(autouse=True)
    def _fake(self, fake_modal):
        self.modal = fake_modal

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
        calls = self.modal.fake_calls()
        # rules a and b of each sample form one group job: 3 groups + rule c
        assert len(calls) == 4, [c["function"] for c in calls]
        out = tmp_path / "groups" / "test3.out"
        assert out.exists()
