"""The Flower apps built with the fake sides, for ``flwr run`` against a real SuperLink.

The loopback tests stage the app and point its pyproject components here
(``fake_apps:serverapp`` / ``fake_apps:clientapp``, or ``fake_apps:hung_clientapp``: partition 1
hangs in round 2, the fault hook of lensemble/federation/faults.py); this folder reaches the
ServerApp and ClientApp processes through PYTHONPATH, since tests are not part of the FAB.
"""

import fake_federation as fake

from lensemble.federation.faults import faulty
from lensemble.federation.flower.client_app import make_client_app
from lensemble.federation.flower.server_app import make_server_app

serverapp = make_server_app(fake.Coordinator)
clientapp = make_client_app(fake.participant_round)
hung_clientapp = make_client_app(faulty(fake.participant_round, {(2, 1): "hang"}, hang_s=3600))
