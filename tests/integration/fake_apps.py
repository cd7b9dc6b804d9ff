"""The Flower apps built with the fake sides, for ``flwr run`` against a real SuperLink.

The loopback test stages the app and points its pyproject components here
(``fake_apps:serverapp`` / ``fake_apps:clientapp``); this folder reaches the ServerApp and
ClientApp processes through PYTHONPATH, since tests are not part of the FAB.
"""

import fake_federation as fake

from lensemble.federation.flower.client_app import make_client_app
from lensemble.federation.flower.server_app import make_server_app

serverapp = make_server_app(fake.Coordinator)
clientapp = make_client_app(fake.participant_round)
