# fedac_example/aggregator.py
"""An aggregator: (uploads, the aggregation settings, the round's global model) -> the new model. Uploads
are (params, weight) pairs, weighted as aggregation.weighting says."""

import torch

from fedac.aggregation import weighted_mean


def drop_farthest(uploads, cfg, reference=None):
    if len(uploads) < 3:
        return weighted_mean(uploads)
    mean = weighted_mean(uploads)
    distance = [sum(float((p[n].double() - mean[n].double()).square().sum()) for n in mean if mean[n].is_floating_point())
                for p, _ in uploads]
    farthest = int(torch.tensor(distance).argmax())
    return weighted_mean([u for k, u in enumerate(uploads) if k != farthest])
