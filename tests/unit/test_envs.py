"""The stable-worldmodel adapter: shapes, goal images, factors, state setting, unknown ids."""

import numpy as np
import pytest

from lensemble.envs import env_info, factor_catalog, factor_spec, make_env
from lensemble.errors import ConfigError

ENVS = ["swm/TwoRoom-v1", "swm/PushT-v1", "swm/ReacherDMControl-v0"]


@pytest.fixture(scope="module", params=ENVS)
def env(request):
    e = make_env(request.param, img_size=32)
    yield e
    e.close()


def test_reset_step_shapes_and_bounds(env):
    info = env_info(env.env_id)
    frame = env.reset(seed=3)
    assert frame.shape == (32, 32, 3) and frame.dtype == np.uint8
    assert env.goal_image().shape == (32, 32, 3) and env.goal_image().dtype == np.uint8
    state = env.state()
    assert state.shape == (info.state_dim,) and state.dtype == np.float32
    assert len(info.action_low) == len(info.action_high) == info.action_dim == 2
    frame2, state2, success = env.step(np.zeros(info.action_dim, np.float32))
    assert frame2.shape == (32, 32, 3) and state2.shape == state.shape and isinstance(success, bool)


def test_same_seed_same_episode_start(env):
    a = env.reset(seed=11)
    s = env.state()
    b = env.reset(seed=11)
    assert np.array_equal(a, b) and np.array_equal(s, env.state())


def test_factor_values_applied_and_not_leaking(env):
    spec = factor_catalog(env.env_id)["agent.color"]
    value = spec.values[spec.silo[2]]
    frame = env.reset(seed=5, factors={"agent.color": value})
    assert env.factor_values(["agent.color"])["agent.color"] == value
    default = env.reset(seed=5)  # next episode without factors: back to the package default
    assert env.factor_values(["agent.color"])["agent.color"] != value
    assert not np.array_equal(frame, default)  # the colour is visible in the frame


def test_every_catalog_value_is_accepted(env):
    for key, spec in factor_catalog(env.env_id).items():
        for value in spec.values:
            env.reset(seed=1, factors={key: value})
            got = env.factor_values([key])[key]
            assert np.allclose(np.asarray(got, float), np.asarray(value, float)), (key, value, got)


def test_set_goal_state_moves_goal_image(env):
    env.reset(seed=2)
    before = env.goal_image().copy()
    s = env.state()
    goal = s.copy()
    if env.env_id == "swm/ReacherDMControl-v0":  # joint angles (rad): 1.5 at the shoulder, the wrist toward 0
        goal[:2] = s[:2] + np.float32([1.5, -0.5 * np.sign(s[1])])
    else:  # positions (px): toward the centre
        goal[:2] = s[:2] + np.float32(30.0) * np.sign(112.0 - s[:2])
    env.set_goal_state(goal)
    np.testing.assert_allclose(env.goal_state()[:2], goal[:2], atol=1e-4)
    assert not np.array_equal(before, env.goal_image())
    env.set_state(goal)
    np.testing.assert_allclose(env.state()[:2], goal[:2], atol=1.0)


def test_roles_are_disjoint():
    for env_id in ENVS:
        for spec in factor_catalog(env_id).values():
            pub, tra, silo = set(spec.public), set(spec.transfer), set(spec.silo)
            assert pub and tra and len(silo) >= 2
            assert not (pub & tra or pub & silo or tra & silo)
            assert pub | tra | silo == set(range(len(spec.values)))


def test_unknown_env_and_factor_raise_config_error():
    with pytest.raises(ConfigError, match="unknown environment"):
        make_env("swm/NoSuchEnv-v0")
    with pytest.raises(ConfigError):
        factor_spec("swm/TwoRoom-v1", "agent.mood")


# ------------------------------------------------------------------ the coverage factor agent.region
@pytest.fixture(scope="module")
def tworoom():
    e = make_env("swm/TwoRoom-v1", img_size=32)
    yield e
    e.close()


def test_region_places_start_and_target_in_its_room(tworoom):
    spec = factor_spec("swm/TwoRoom-v1", "agent.region")
    assert [spec.values[i] for i in spec.silo] == [[0, 112], [112, 224]]
    for region in ([0, 112], [112, 224], [92, 132]):
        for seed in range(15):
            tworoom.reset(seed, {"agent.region": region})
            for x in (tworoom.agent_position()[0], tworoom.goal_state()[0]):
                assert region[0] <= x <= region[1], (region, seed, x)
            assert tworoom.distance_to_goal() >= 32.0  # never a task solved at its start
    # The door band holds positions on both sides of the wall, so its episodes cross the door.
    sides = set()
    for seed in range(30):
        tworoom.reset(seed, {"agent.region": [92, 132]})
        sides.add(bool(tworoom.agent_position()[0] > 112))
    assert sides == {True, False}


def test_region_whole_arena_is_the_envs_own_reset_and_does_not_leak(tworoom):
    plain = tworoom.reset(7)
    s_plain, g_plain = tworoom.state(), tworoom.goal_state()
    whole = tworoom.reset(7, {"agent.region": [0, 224]})
    assert np.array_equal(plain, whole) and np.array_equal(s_plain, tworoom.state())
    assert np.array_equal(g_plain, tworoom.goal_state())
    room = tworoom.reset(7, {"agent.region": [112, 224]})
    assert not np.array_equal(room, plain)
    again = tworoom.reset(7)  # the next episode without the factor: the env's own sampling again
    assert np.array_equal(again, plain) and tworoom.region is None
    assert tworoom.factor_values(["agent.region"]) == {"agent.region": [0, 224]}


def test_region_collection_stays_in_its_room(tworoom):
    from lensemble.data.collect import collect_episode

    for seed in range(4):
        ep = collect_episode(tworoom, seed, {"agent.region": [0, 112]}, 80, random_share=0.3)
        assert ep["state"][:, 0].max() < 112 and ep["factors"] == {"agent.region": [0, 112]}
    # Without the factor the same expert visits both rooms.
    xs = np.concatenate([collect_episode(tworoom, s, {}, 80, random_share=0.3)["state"][:, 0] for s in range(4)])
    assert xs.min() < 112 < xs.max()


def test_region_rejects_bad_values_and_other_envs(tworoom):
    for bad in ([120, 100], [0, 300], [5]):
        with pytest.raises(ConfigError):
            tworoom.reset(1, {"agent.region": bad})
    pusht = make_env("swm/PushT-v1", img_size=32)
    try:
        with pytest.raises(ConfigError):
            pusht.reset(1, {"agent.region": [0, 112]})
    finally:
        pusht.close()
