"""Package-scoped cases (one algorithm each) shared by the connector test modules."""

from __future__ import annotations

import pytest

from tests.connectors._cases import Case, multi_agent_config, small_config


@pytest.fixture(scope="package")
def cartpole(ray_session):
    case = Case(small_config(), num_timesteps=1500)
    yield case
    case.algo.stop()


@pytest.fixture(scope="package")
def multi_agent(ray_session):
    case = Case(multi_agent_config(), num_timesteps=800)
    yield case
    case.algo.stop()


@pytest.fixture(scope="package")
def lstm(ray_session):
    config = small_config(model_config={"use_lstm": True, "max_seq_len": 20, "lstm_cell_size": 16})
    case = Case(config, num_timesteps=600)
    # A second sample: episodes still running at the end of the first continue in chunks with
    # t_started > 0, whose first state_in is the state_out in their lookback.
    case.episodes = case.algo.env_runner.sample(num_timesteps=600, random_actions=False)
    yield case
    case.algo.stop()
