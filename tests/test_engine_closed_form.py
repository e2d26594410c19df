"""
Both engines against a closed form: a Gaussian image prior and a linear encoder, for
which the optimal noise predictor is linear and stands in for the UNet exactly.

Model: x ~ N(0, S) on P pixels, r = W x + sigma xi, x_t = sqrt(a) x + sqrt(1 - a) z. By
Gaussian conditioning on (x_t, r), the posterior precision of x is
L_t = S^-1 + a / (1 - a) I + W^T W / sigma^2, and the optimal noise prediction
E[z | x_t, r] = (x_t - sqrt(a) E[x | x_t, r]) / sqrt(1 - a) is A_t x_t + B_t r with

    A_t = (I - a / (1 - a) L_t^-1) / sqrt(1 - a),
    B_t = -sqrt(a) / (sqrt(1 - a) sigma^2) L_t^-1 W^T

(the null token r = 0 gets the unconditional optimum, L_t without the W^T W term). Then
a row of D is sqrt(w_j / 2 N_MC) sigma B_t (xi_1 - xi_2), so

    E[D^T D] = sigma^2 sum_j w_j B_{t_j} B_{t_j}^T,

with upstream's trapezoid weights w_j on log tau_j = log((1 - a_j) / a_j), and the
Fisher information of the linear encoder is J = sigma^-2 W^T W exactly (Azeglio et al.
2026, Algorithm 1 and Appendix C.2).

The Monte-Carlo error of D^T D, a weighted sum of sample covariances of the zero-mean
Gaussian rows with covariances C_j = 2 sigma^2 B_j B_j^T, has
E ||D^T D - E[D^T D]||_F^2 = sum_j (w_j / 2)^2 (tr(C_j)^2 + ||C_j||_F^2) / N_MC: the
tolerance below is 3 times its square root, so it shrinks like 1 / sqrt(N_MC).
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import torch

from multigeom_workflow.compute.engine import estimate_image_fast

SIDE, N_NEURONS, SIGMA = 4, 4, 0.22
P = SIDE * SIDE
GRID = (100, 400, 700)


def alphas_cumprod() -> torch.Tensor:
    """DDPM linear schedule of the paper: beta from 1e-4 to 0.02 over 1000 steps."""
    betas = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)
    return torch.cumprod(1.0 - betas, 0)


def model():
    g = torch.Generator().manual_seed(7)
    Q, _ = torch.linalg.qr(torch.randn(P, P, generator=g, dtype=torch.float64))
    prior = Q @ torch.diag(torch.logspace(-0.5, -2, P, dtype=torch.float64)) @ Q.T
    W = torch.randn(N_NEURONS, P, generator=g, dtype=torch.float64) * torch.tensor(
        [3.0, 2.0, 1.2, 0.7], dtype=torch.float64
    ).view(-1, 1)
    x = torch.linalg.cholesky(prior) @ torch.randn(P, generator=g, dtype=torch.float64)
    return prior, W, x.clamp(-1, 1)


def optimal_eps(prior, W, a):
    """A_t, B_t, and A_t of the null token, for one a = alpha-bar_t (float64)."""
    eye = torch.eye(P, dtype=torch.float64)
    base = torch.linalg.inv(prior) + a / (1 - a) * eye
    L_inv = torch.linalg.inv(base + W.T @ W / SIGMA**2)
    L0_inv = torch.linalg.inv(base)
    A = (eye - a / (1 - a) * L_inv) / (1 - a) ** 0.5
    A0 = (eye - a / (1 - a) * L0_inv) / (1 - a) ** 0.5
    B = -(a**0.5) / ((1 - a) ** 0.5 * SIGMA**2) * L_inv @ W.T
    return A, B, A0


class LinearEncoder(torch.nn.Module):
    """f(x) = W x on flattened images."""

    def __init__(self, W):
        super().__init__()
        self.register_buffer("W", W.float())
        self.n_neurons = W.shape[0]

    def forward(self, x):
        return x.flatten(1) @ self.W.T


class OptimalUNet(torch.nn.Module):
    """eps*(x_t, t, r) = A_t x_t + B_t r (A0_t x_t for the null token r = 0)."""

    def __init__(self, prior, W, ac):
        super().__init__()
        mats = [optimal_eps(prior, W, float(ac[t])) for t in range(len(ac))]
        self.register_buffer("A", torch.stack([m[0] for m in mats]).float())
        self.register_buffer("B", torch.stack([m[1] for m in mats]).float())
        self.register_buffer("A0", torch.stack([m[2] for m in mats]).float())

    def forward(self, x_t, t, r):
        xf = x_t.flatten(1).unsqueeze(-1)
        null = (r == 0).all(dim=1).view(-1, 1, 1)
        A = torch.where(null, self.A0[t], self.A[t])
        out = (A @ xf + self.B[t] @ r.unsqueeze(-1)).squeeze(-1)
        return out.view_as(x_t)


def settings(n_samples: int) -> SimpleNamespace:
    mc = SimpleNamespace(
        n_samples=n_samples,
        batch_size=64,
        timestep_grid=SimpleNamespace(
            start=GRID[0], stop=GRID[-1], step=GRID[1] - GRID[0]
        ),
        observation_noise_sigma=SIGMA,
    )
    return SimpleNamespace(
        monte_carlo=mc,
        top_k=P,
        seed=3,
        fisher_baseline=SimpleNamespace(enabled=True, top_k=P),
    )


def closed_form(prior, W, ac):
    """E[D^T D], the Monte-Carlo variance numerator, and J, all float64."""
    log_tau = torch.log((1 - ac[list(GRID)]) / ac[list(GRID)])
    w = torch.empty_like(log_tau)
    w[0] = 0.5 * (log_tau[1] - log_tau[0])
    w[-1] = 0.5 * (log_tau[-1] - log_tau[-2])
    w[1:-1] = 0.5 * (log_tau[2:] - log_tau[:-2])
    G = torch.zeros(P, P, dtype=torch.float64)
    var = 0.0
    for wj, t in zip(w, GRID, strict=True):
        B = optimal_eps(prior, W, float(ac[t]))[1]
        G += SIGMA**2 * wj * B @ B.T
        C = 2 * SIGMA**2 * B @ B.T
        var += float((wj / 2) ** 2 * (torch.trace(C) ** 2 + (C**2).sum()))
    return G, var, W.T @ W / SIGMA**2


def run(engine, n_samples, prior, W, x, ac):
    from multigeom.pipeline.per_image import estimate_image

    encoder, unet = LinearEncoder(W), OptimalUNet(prior, W, ac)
    image = x.float().view(1, 1, SIDE, SIDE)
    if engine == "upstream":
        fn = estimate_image
    else:  # fast, with the eigen-step of the CPU (svd) or of a GPU (gram)
        fn = partial(estimate_image_fast, eigen=engine.split("-")[1])
    with torch.no_grad():
        return fn(
            image,
            encoder,
            unet,
            ac.float(),
            settings(n_samples),
            seed=3,
            device=torch.device("cpu"),
        )


def alignment(U, V, k):
    return float((U[:k].double() @ V[:k].double().T).pow(2).sum() / k)


@pytest.mark.parametrize("engine", ["upstream", "fast-svd", "fast-gram"])
def test_both_engines_converge_to_the_closed_form(engine):
    prior, W, x = model()
    ac = alphas_cumprod()
    G, var, J = closed_form(prior, W, ac)
    values, vectors = torch.linalg.eigh(G)
    values, vectors = values.flip(0), vectors.flip(1).T
    k = 2  # the top-2 subspace: its gap to the third eigenvalue bounds its error
    gap = float(values[k - 1] - values[k])
    errors = []
    for n in (256, 4096):
        g_out, j_out = run(engine, n, prior, W, x, ac)
        tol = 3 * (var / n) ** 0.5
        lam, V = g_out.eigenvalues.double(), g_out.eigenvectors.double()
        assert lam.shape == (P,) and V.shape == (P, P)
        G_hat = V.T @ torch.diag(lam) @ V  # all P eigenpairs: D^T D itself
        err = float(torch.linalg.matrix_norm(G_hat - G))
        errors.append(err)
        assert err <= tol, (n, err, tol)
        # Weyl: eigenvalues move by at most the spectral norm of the error.
        assert float((lam - values).abs().max()) <= tol
        # Davis-Kahan (Yu, Wang & Samworth 2015): ||sin Theta||_F <= 2 ||E||_F / gap.
        assert 1 - alignment(V, vectors, k) <= (2 * tol / gap) ** 2 / k
    assert errors[1] < errors[0]
    # J(x) of a linear encoder is sigma^-2 W^T W, whatever the image.
    j_values, j_vectors = torch.linalg.eigh(J)
    j_values, j_vectors = j_values.flip(0)[:N_NEURONS], j_vectors.flip(1).T
    assert j_out.eigenvalues.shape == (N_NEURONS,)
    torch.testing.assert_close(j_out.eigenvalues.double(), j_values, rtol=1e-5, atol=0)
    for kk in range(1, N_NEURONS + 1):
        assert alignment(j_out.eigenvectors, j_vectors, kk) >= 1 - 1e-6
