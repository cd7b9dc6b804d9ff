"""TwoRoom route validity (the env checks the door only at a step's end point) and the oracle's
batched dynamics (bit-identical to stable-worldmodel's own step)."""

import numpy as np
import pytest
import torch

from lensemble.eval.routes import RouteTracker, TwoRoomDynamics, WallGeometry, step_is_legal

# The default TwoRoom wall: vertical at x = 112, thickness 10 (half 5), one door centred at y = 49
# with half-extent 14: the opening for the agent's centre is y in [49 - 15.75, 49 + 15.75].
WALL = WallGeometry(axis=1, center=112.0, half_thickness=5.0, doors=((49.0, 14.0),))
TOP = 49.0 + 14.0 + 1.75


def test_known_answers_of_the_step_check():
    assert step_is_legal((100, 49), (124, 49), WALL)            # straight through the door
    assert step_is_legal((100, 40), (124, 60), WALL)            # diagonally, inside the opening
    assert step_is_legal((20, 150), (90, 200), WALL)            # stays in the left room
    assert step_is_legal((112, 40), (112, 60), WALL)            # along the wall, inside the door
    assert not step_is_legal((100, 150), (124, 150), WALL)      # through solid wall
    assert not step_is_legal((112, 40), (112, TOP + 1), WALL)   # leaves the door inside the wall
    # Cuts the corner: ends inside the opening but crosses wall pixels just above it.
    assert not step_is_legal((100, TOP + 9.0), (110.5, TOP - 1.5), WALL)
    # The same for a horizontal wall (coordinates swapped).
    horiz = WallGeometry(axis=0, center=112.0, half_thickness=5.0, doors=((49.0, 14.0),))
    assert step_is_legal((49, 100), (49, 124), horiz) and not step_is_legal((150, 100), (150, 124), horiz)
    # Two doors whose openings overlap act as one.
    two = WallGeometry(axis=1, center=112.0, half_thickness=5.0, doors=((40.0, 10.0), (60.0, 10.0)))
    assert step_is_legal((112, 30), (112, 70), two)


@pytest.fixture(scope="module")
def env():
    pytest.importorskip("stable_worldmodel")
    from lensemble.envs import make_env

    e = make_env("swm/TwoRoom-v1", 32)
    yield e
    e.close()


def test_the_env_lets_a_corner_cut_through_and_route_validity_flags_it(env):
    env.reset(0, {"agent.speed": [10.5]})
    u = env.unwrapped
    door, size = float(u.door_positions[0]), float(u.door_sizes[0])
    top = door + size + 1.75
    env.set_state([100.0 - 0.5, top + 9.0])   # left of the wall, 9 px above the opening
    tracker = RouteTracker(env)
    tracker.step(np.array([1.0, -1.0], np.float32))
    x, y = env.agent_position()
    assert x == pytest.approx(110.0, abs=1e-4) and y < top   # the env accepted the step: no clamp
    assert tracker.valid is False and tracker.illegal_steps == 1
    # A step straight through the middle of the door is legal.
    env.set_state([100.0, door])
    ok = RouteTracker(env)
    for _ in range(3):
        ok.step(np.array([1.0, 0.0], np.float32))
    assert env.agent_position()[0] > 124.0 and ok.valid is True


@pytest.mark.parametrize("factors", [{}, {"agent.speed": [10.5], "wall.thickness": 7},
                                     {"wall.axis": 0, "door.number": 2, "agent.radius": [12.0]}])
def test_batched_dynamics_match_the_env_step_bit_for_bit(env, factors):
    rng = np.random.default_rng(0)
    for episode in range(4):
        env.reset(100 + episode, factors)
        dyn = TwoRoomDynamics.from_envs([env])
        pos = torch.from_numpy(env.agent_position())[None]
        for _ in range(60):
            # Many steps towards the wall, so the collision and door branches are exercised.
            a = np.clip(rng.normal(0.6 if episode % 2 == 0 else -0.6, 0.8, size=2), -1.3, 1.3).astype(np.float32)
            env.step(a)
            pos = dyn.step(pos, torch.from_numpy(a)[None])
            assert np.array_equal(pos[0].numpy(), env.agent_position()), (factors, episode)
