# fedac_example/availability.py
"""An availability model: when each client's device is online. Office hours: every client is
online eight hours a virtual day, from 9:00, 10:00 or 11:00 by its position in the run (staggered
shifts)."""

from fedac.data.traces import merged

DAY_S = 86400.0


def office_hours(clients, seed):
    """{client: Schedule}; merged joins intervals and repeats them every DAY_S seconds."""
    schedules = {}
    for i, client in enumerate(clients):
        start = (9 + i % 3) * 3600.0
        schedules[client] = merged([(start, start + 8 * 3600.0)], DAY_S)
    return schedules
