import warnings

import pytest

# Thunder warns at import that transformer_engine is missing; irrelevant on CPU.
warnings.filterwarnings("ignore", message="transformer_engine module not found")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "claims_fix: tests of the fix; `make stock-fails` checks each fails on the pristine base"
    )
    config.addinivalue_line(
        "markers", "keeps_stock_behaviour: checks behaviour the fix must not change; passes on the pristine base too"
    )
    config.addinivalue_line("markers", "slow: long profiles and sweeps, not run by `make test` (run `make test-slow`)")
