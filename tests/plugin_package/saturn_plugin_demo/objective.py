"""A trial that trains under its strategy's engine and records which engine prepared its model."""

import torch


def records_its_engine(trial) -> float:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    for _ in trial.steps(2):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            trial.backward(loss)
            optimizer.step()
    trial.set_user_attr("prepared_by", getattr(trial.unwrap(model), "prepared_by", None))
    trial.set_user_attr("wrapper", type(model).__name__)
    trial.set_user_attr("world_size", trial.world_size)
    return float(loss)
