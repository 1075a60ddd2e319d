"""fedac on Flower: a ServerApp and a ClientApp that run the fedac algorithms unchanged.

- `fedac.flower.serverapp:app`  the ServerApp (fedac server side, evaluation, run directory)
- `fedac.flower.clientapp:app`  the ClientApp (one fedac client per SuperNode, state in
                                context.state)
- `fedac.flower.strategy`       `FedacStrategy` (a Flower Strategy delegating to
                                `Algorithm.server_update`) and `flower_strategy` (Flower's own
                                strategies configured as fedac's)
- `fedac.flower.transport`      payloads <-> Flower ArrayRecord / ConfigRecord, exactly
- `fedac.flower.settings`       run-config / node-config -> fedac settings
- `fedac.flower.devices`        device mode: a node that holds only its own folder of clips
- `fedac.flower.secagg`         run-config secagg=true: FedAvg-style uploads summed by Flower's
                                SecAgg+

See docs/flower.md. Importing this package does not import flwr; its modules do.

Belongs here: adapters between Flower and the fedac algorithms (apps, strategy, transport, settings,
device mode, SecAgg+). Must not be here: algorithm logic (a client or server step is the algorithm's
own, called unchanged) or a round loop of the simulator's, and no import of the experiment commands
or cli.
"""
