"""Replica symmetry of the network: flows of one representative replica on a quotient network.

In a run with rank symmetry (``twin.scenario.Scenario.symmetric``) every transfer is sent for
all data-parallel replicas alike. Let ``sigma`` be the device permutation that moves every rank
``(d, p, t)`` to ``((d + k) mod dp, p, t)`` (a *replica shift* of ``k``), of order
``n = dp / k``. If a permutation ``P`` of the directed links (and HBM ports) maps the route of
every flow ``a -> b`` onto the route of the flow ``sigma(a) -> sigma(b)`` of the same transfer,
with the same bytes, and preserves link capacities, then the whole max-min allocation problem
(links, capacities, flows and their routes) is invariant under ``(sigma, P)``. Its max-min fair
allocation is unique, so it is invariant too: the ``n`` flows of an orbit always have the same
rate, and the ``n`` links of a cycle of ``P`` the same load. One representative flow per orbit
(the one sent by a device of replicas ``0 .. k-1``) is then enough, on a *quotient* network in
which a link ``l`` stands for its cycle ``C(l)`` of ``P`` with capacity

    c(l) * |C(l)| / n

because the flows of an orbit cross the links of ``C(l)`` ``n * m / |C(l)|`` times each, where
``m`` is the number of links of ``C(l)`` on the representative's route (the flow engine counts a
link that appears ``m`` times on a route ``m`` times, which is this weight). Progressive filling
on the quotient network reaches every level at the same time as on the full one, so the rates,
and with them every completion time, are the same up to floating-point rounding. A link ``l``
of the full network carried ``n / |C(l)|`` times what its cycle's link carried in the quotient;
its busy time is the same.

:class:`ReplicaQuotient` learns ``P`` from the transfers themselves, one phase plan at a time
(:meth:`ReplicaQuotient.reduce`), and raises :class:`QuotientBroken` when a plan is not
invariant (a phase that treats replicas differently, a route choice that is not equivariant):
the caller then simulates the run again with every flow (``twin.runner``). The shift is chosen
by :func:`replica_shift`, which tries the smallest ``k`` dividing ``dp`` on a sample of the
run's pairs (pipeline neighbours, tensor-parallel pairs and the data-parallel / sharding rings).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise

import numpy as np


class QuotientBroken(Exception):
    """A phase is not invariant under the replica shift: the quotient network does not
    represent the run (the run is simulated again with every flow)."""


class ReplicaQuotient:
    """The link permutation ``P`` of one replica shift, learnt plan by plan.

    Args:
        sigma: image of every device under the shift (a permutation of ``0..n_devices-1``).
        order: order ``n`` of the shift (``dp / k``); ``sigma`` must move every device.
        domain: mask of the devices of replicas ``0 .. k-1`` (the representatives' senders).
        capacity: bytes/s of every flow-engine link (links, then HBM ports; ``inf`` allowed),
            read when a link is first seen (capacities must agree along a cycle).
        n_links: number of flow-engine link ids (links and ports).
    """

    def __init__(self, sigma: np.ndarray, order: int, domain: np.ndarray,
                 capacity: Callable[[np.ndarray], np.ndarray], n_links: int):
        self.sigma = np.asarray(sigma, dtype=np.int64)
        self.order = int(order)
        self.domain = np.asarray(domain, dtype=bool)
        self._capacity = capacity
        self.image = np.full(n_links, -1, dtype=np.int64)  # P, -1 where not learnt yet
        self._preimage = np.full(n_links, -1, dtype=np.int64)
        self.canon = np.full(n_links, -1, dtype=np.int64)  # the cycle's link in the quotient
        self.cycle = np.zeros(n_links, dtype=np.int64)     # |C(l)|

    def weight(self, links: np.ndarray) -> np.ndarray:
        """``n / |C(l)|``: bytes a link of the full network carries per byte its cycle's
        link carries in the quotient (0 for links no reduced plan has used)."""
        c = self.cycle[links]
        out = np.zeros(len(c))
        used = c > 0
        out[used] = self.order / c[used]
        return out

    def capacity_scale(self, links: np.ndarray) -> np.ndarray:
        """``|C(l)| / n`` of learnt links (the quotient capacity is ``c(l)`` times it)."""
        return self.cycle[links] / self.order

    def reduce(self, src: np.ndarray, dst: np.ndarray, routes: Sequence[Sequence[int]],
               total: np.ndarray) -> tuple[list[tuple[int, ...]], np.ndarray, np.ndarray]:
        """The representative flows of one phase plan on the quotient network.

        Args:
            src, dst: sender and receiver device of every flow.
            routes: flow-engine route (link ids) of every flow.
            total: bytes of every flow.

        Returns:
            ``(routes, bytes, new)``: the representatives' routes in quotient link ids, their
            bytes, and the quotient links this plan used for the first time (their capacities
            must be set to ``c * |C| / n`` before any flow crosses them).

        Raises:
            QuotientBroken: the plan is not invariant under the shift (a missing image flow,
                other bytes or route length, a link mapped two ways, unequal capacities).
        """
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        total = np.asarray(total, dtype=float)
        f = len(src)
        if f % self.order:
            raise QuotientBroken(f"a phase of {f} flows is not a union of orbits of "
                                 f"{self.order}")
        index = {pair: i for i, pair in enumerate(zip(src.tolist(), dst.tolist(), strict=True))}
        if len(index) != f:
            raise QuotientBroken("a phase sends twice between the same pair")
        try:
            img = np.fromiter((index[pair] for pair in zip(self.sigma[src].tolist(),
                                                           self.sigma[dst].tolist(),
                                                           strict=True)),
                              dtype=np.int64, count=f)
        except KeyError:
            raise QuotientBroken("a phase has a flow whose image under the shift it "
                                 "does not send") from None
        if not np.array_equal(total[img], total):
            raise QuotientBroken("a flow and its image send different bytes")
        lens = np.fromiter((len(r) for r in routes), dtype=np.int64, count=f)
        if not np.array_equal(lens[img], lens):
            raise QuotientBroken("a flow and its image have routes of different lengths")
        arr = [np.asarray(r, dtype=np.int64) for r in routes]
        empty = np.empty(0, dtype=np.int64)
        ent = np.concatenate(arr) if f else empty
        ent_img = np.concatenate([arr[j] for j in img.tolist()]) if f else empty
        self._learn(ent, ent_img)
        reps = np.flatnonzero(self.domain[src])
        if len(reps) * self.order != f:
            raise QuotientBroken("a phase's flows are not one per replica orbit")
        new = self._cycles(np.unique(ent))
        canon = self.canon
        return ([tuple(canon[arr[i]].tolist()) for i in reps.tolist()], total[reps], new)

    def _learn(self, ent: np.ndarray, ent_img: np.ndarray) -> None:
        """Record ``P(ent[e]) = ent_img[e]``, checking it is a function, injective and
        capacity-preserving."""
        if not len(ent):
            return
        pairs = np.unique(np.stack([ent, ent_img], axis=1), axis=0)
        if len(np.unique(pairs[:, 0])) != len(pairs) or len(np.unique(pairs[:, 1])) != len(
                pairs):
            raise QuotientBroken("the shift maps a link onto two links (routes are not "
                                 "equivariant)")
        a, b = pairs[:, 0], pairs[:, 1]
        known = self.image[a]
        if np.any((known >= 0) & (known != b)):
            raise QuotientBroken("a link's image differs between phases")
        back = self._preimage[b]
        if np.any((back >= 0) & (back != a)):
            raise QuotientBroken("two links map onto the same link")
        ca, cb = self._capacity(a), self._capacity(b)
        if not np.array_equal(ca, cb):
            raise QuotientBroken("the shift maps a link onto one of another capacity")
        self.image[a] = b
        self._preimage[b] = a

    def _cycles(self, links: np.ndarray) -> np.ndarray:
        """Give the links of ``links`` not yet in a cycle their cycle (canonical link: the
        smallest id of the cycle); returns the canonical links that are new."""
        new = []
        image, canon, cycle = self.image, self.canon, self.cycle
        for lk in links[canon[links] < 0].tolist():
            if canon[lk] >= 0:
                continue
            cyc = [lk]
            nxt = int(image[lk])
            while nxt != lk:
                if nxt < 0 or len(cyc) > self.order:
                    raise QuotientBroken("a link's orbit under the shift leaves the phase")
                cyc.append(nxt)
                nxt = int(image[nxt])
            if self.order % len(cyc):
                raise QuotientBroken("a link's cycle does not divide the shift's order")
            c = min(cyc)
            canon[cyc] = c
            cycle[cyc] = len(cyc)
            new.append(c)
        return np.asarray(new, dtype=np.int64)


def shift_permutation(device: np.ndarray, dp: int, pp: int, tp: int, k: int) -> np.ndarray:
    """Device permutation moving rank ``(d, p, t)``'s device to rank ``((d + k) mod dp, p, t)``'s
    (``device``: device of every rank, ``r = (d * pp + p) * tp + t``)."""
    r = np.arange(dp * pp * tp)
    per = pp * tp
    moved = (r + k * per) % (dp * per)
    sigma = np.empty(len(device), dtype=np.int64)
    sigma[device] = device[moved]
    return sigma


def replica_shift(device: np.ndarray, dp: int, pp: int, tp: int,
                  probe: Callable[[ReplicaQuotient], None],
                  make: Callable[[np.ndarray, int, np.ndarray], ReplicaQuotient]
                  ) -> ReplicaQuotient | None:
    """The quotient of the smallest replica shift ``k`` (``k`` divides ``dp``, ``k < dp``)
    that passes ``probe`` (a trial reduction of sample phases), or None.

    ``make(sigma, order, domain)`` builds a fresh :class:`ReplicaQuotient`; ``probe(q)`` raises
    :class:`QuotientBroken` when the sample does not reduce. The quotient returned is a fresh
    one: the trial's cycles were never given quotient capacities."""
    per = pp * tp
    for k in range(1, dp // 2 + 1):
        if dp % k:
            continue
        sigma = shift_permutation(device, dp, pp, tp, k)
        domain = np.zeros(len(device), dtype=bool)
        domain[device[: k * per]] = True
        try:
            probe(make(sigma, dp // k, domain))
        except QuotientBroken:
            continue
        return make(sigma, dp // k, domain)
    return None


def quotient_for(layout, router, fabric) -> ReplicaQuotient | None:
    """The quotient of the smallest replica shift of ``layout`` (``workloads.parallel.Layout``)
    under which sample pairs of the run reduce on ``fabric`` (``devices.fabric.Fabric``, routes
    from ``router``), or None. The sample: the pipeline neighbours of replica 0 both ways, one
    tensor-parallel pair, and the data-parallel and sharding rings of rank 0, closed under the
    shift; the run itself then checks every phase it plans (:meth:`ReplicaQuotient.reduce`)."""
    lay = layout
    r0 = [int(lay.rank(0, p, 0)) for p in range(lay.pp)]
    pairs = [*pairwise(r0), *((b, a) for a, b in pairwise(r0))]
    if lay.tp > 1:
        pairs.append((r0[0], int(lay.rank(0, 0, 1))))
    dev = lay.device
    pairs = [(int(dev[a]), int(dev[b])) for a, b in pairs]
    for kind in ["dp"] + (["shard", "replica"] if lay.shard is not None else []):
        ring = lay.group_devices(kind, int(lay.group_id(kind, np.array([0]))[0])).tolist()
        if len(ring) > 1:
            pairs += list(pairwise([*ring, ring[0]]))
    n_links = len(fabric.capacity) + (len(fabric.port_capacity) if fabric.ports else 0)

    def probe(q: ReplicaQuotient) -> None:
        closed, frontier = set(pairs), list(pairs)
        while frontier:  # close the sample under the shift
            nxt = [(int(q.sigma[a]), int(q.sigma[b])) for a, b in frontier]
            frontier = [p for p in nxt if p not in closed]
            closed.update(frontier)
        src, dst = (np.array(x, dtype=np.int64) for x in zip(*sorted(closed), strict=True))
        routes = fabric.with_ports([router.route(int(a), int(b)) for a, b in
                                    zip(src.tolist(), dst.tolist(), strict=True)],
                                   src.tolist(), dst.tolist())
        q.reduce(src, dst, routes, np.ones(len(src)))

    return replica_shift(dev, lay.dp, lay.pp, lay.tp, probe, lambda sigma, order, domain:
                         ReplicaQuotient(sigma, order, domain, fabric.real_capacity, n_links))
