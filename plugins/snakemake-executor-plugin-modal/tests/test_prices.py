"""
GPU types Modal sells that the plugin's table cannot price (issue 37): refused in one
line that names the type and how to give its price, never guessed; a price given with
``--modal-gpu-prices`` prices the type for the budget guard as the table does.
"""

from __future__ import annotations

import pytest

from snakemake_executor_plugin_modal import ExecutorSettings, prices
from snakemake_executor_plugin_modal.calls import Ledger
from snakemake_executor_plugin_modal.preflight import gpu_problem, settings_problems
from snakemake_executor_plugin_modal.prices import (
    ContainerRequest,
    parse_gpu,
    parse_prices,
)


@pytest.fixture(autouse=True)
def no_given_prices(monkeypatch):
    """Each test starts with no given price (they are per process)."""
    monkeypatch.setattr(prices, "_GIVEN", {})


@pytest.mark.parametrize("spec", ["RTX-PRO-6000", "B200+", "B200+:2", "H100,B200+"])
def test_todays_unpriced_types_are_refused_naming_how_to_price_them(spec):
    found = gpu_problem(spec, "--modal-gpu")
    gpu_type = [t for t in parse_gpu(spec).types if t not in prices.PRICES_USD_PER_S]
    assert found is not None and "\n" not in found
    assert f"GPU type {gpu_type[0]!r} is not one the plugin knows" in found
    assert f"--modal-gpu-prices {gpu_type[0]}=<USD>" in found


def test_a_given_price_prices_the_type_for_the_guard():
    settings = ExecutorSettings(gpu_prices=["RTX-PRO-6000=0.0009", "b200+=0.002"])
    assert prices.given_prices() == {"RTX-PRO-6000": 0.0009, "B200+": 0.002}
    assert gpu_problem("RTX-PRO-6000", "--modal-gpu") is None
    assert gpu_problem("H100:2,B200+:2", "--modal-gpu") is None
    gpu = parse_gpu("B200+:2")
    assert gpu.usd_per_second == pytest.approx(0.004)
    # with Modal's default 0.125 cores and 128 MiB (0.0000131 and 0.00000222 USD/s
    # per core and per GiB), for 100 s + 120 s of start-up
    request = ContainerRequest(gpu)
    assert Ledger(10.0).worst_case(request, 100) == pytest.approx(0.004001915 * 220)
    assert not any("--modal-gpu-prices" in p for p in settings_problems(settings))
    # a given price wins over the table's
    prices.give_prices(parse_prices("A100-80GB=0.001"))
    assert prices.price_per_second("A100-80GB") == 0.001
    assert prices.price_table()["A100-80GB"] == 0.001


@pytest.mark.parametrize(
    "entry", ["RTX-PRO-6000", "RTX-PRO-6000=", "=0.001", "L4=-1", "L4=free", "L4=inf"]
)
def test_a_malformed_price_is_named(entry):
    with pytest.raises(ValueError, match="is not TYPE=USD"):
        parse_prices([entry])
    settings = ExecutorSettings(gpu_prices=[entry])
    named = [p for p in settings_problems(settings) if "--modal-gpu-prices" in p]
    assert named == [
        f"--modal-gpu-prices: {entry!r} is not TYPE=USD, the price of one GPU per "
        "second from Modal's price page (e.g. 'RTX-PRO-6000=0.000842')"
    ]
    assert prices.given_prices() == {}
