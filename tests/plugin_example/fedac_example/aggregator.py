# fedac_example/aggregator.py
"""An aggregator: (uploads, the aggregation settings, the round's global model) -> the new model.
Uploads are (params, weight) pairs, weighted as aggregation.weighting says. Its own setting,
aggregation.drop (settings.py), is read from the same section as the shared ones."""

import torch

from fedac.rules.aggregation import weighted_mean


def drop_farthest(uploads, cfg, reference=None):
    if len(uploads) < cfg.drop + 2:  # keep at least two uploads
        return weighted_mean(uploads)
    mean = weighted_mean(uploads)
    distance = torch.tensor(
        [
            sum(
                float((p[n].double() - mean[n].double()).square().sum())
                for n in mean
                if mean[n].is_floating_point()
            )
            for p, _ in uploads
        ]
    )
    nearest = sorted(distance.argsort()[: len(uploads) - cfg.drop].tolist())
    return weighted_mean([uploads[k] for k in nearest])
