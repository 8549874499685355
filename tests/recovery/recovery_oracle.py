"""A brute-force model of docs/definitions.md, written plainly on Python sets and Counters.

It shares no code with recoverydash.recovery: it reads wire-shaped records (the dataclasses are
only containers) and recomputes every position figure by enumerating positions one by one (a
DistributedSampler order's permutation too, from MT19937 written out: ``torch_randperm``). Use
it on small runs only.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter

DISTRIBUTED_SAMPLER = "torch.utils.data.DistributedSampler"


def mt19937(seed):
    """MT19937 seeded by init_genrand(seed mod 2**32): an endless iterator of 32-bit words."""
    mt = [seed % 2 ** 32]
    for i in range(1, 624):
        mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + i) % 2 ** 32)
    while True:
        for i in range(624):
            y = (mt[i] & 0x80000000) + (mt[(i + 1) % 624] & 0x7FFFFFFF)
            mt[i] = mt[(i + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF * (y % 2))
        for y in mt:
            y ^= y >> 11
            y ^= (y << 7) & 0x9D2C5680
            y ^= (y << 15) & 0xEFC60000
            yield y ^ (y >> 18)


def torch_randperm(n, seed):
    """torch.randperm(n) of a CPU generator seeded with ``seed`` (n below 2**32 // 20)."""
    out, words = list(range(n)), mt19937(seed)
    for i in range(n - 1):
        z = i + next(words) % (n - i)
        out[i], out[z] = out[z], out[i]
    return out


def position_of(identity):
    if isinstance(identity, int) and 0 <= identity < 2 ** 63:
        return identity
    data = f"int:{identity:d}".encode() if isinstance(identity, int) else identity.encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class Model:
    def __init__(self, run, now=None, settle=300.0):
        self.run = run
        self.now, self.settle = now, settle
        self.attempts = {a.attempt: a for a in run.attempts}
        for rec in run.ledger:
            self.attempts.setdefault(rec.attempt, None)
        self.generations = {g.generation_id: g for g in run.generations}
        self.id_strata = set()
        self.hashed_strata = set()  # id strata with an id that is not an int in [0, 2**63)
        # (attempt, update, rank) -> {key: set of positions}, reports of one rank united
        self.reports = {}
        # (attempt, update, rank) -> {key: set of dataset indices}: the keys some span of the
        # report named indices for (a span's "indices", sample identities of its positions)
        self.indices = {}
        for rec in run.ledger:
            mine = self.reports.setdefault((rec.attempt, rec.update, rec.rank), {})
            named = self.indices.setdefault((rec.attempt, rec.update, rec.rank), {})
            for span in rec.spans:
                if span.get("padding"):
                    continue
                key = (span["stratum"], span.get("epoch", 0), span.get("order"))
                positions = mine.setdefault(key, set())
                if "indices" in span and "ranges" in span:
                    into = named.setdefault(key, set())
                    for item in span["indices"]:
                        into.update([item] if isinstance(item, int) else range(*item))
                if "ids" in span:
                    self.id_strata.add(span["stratum"])
                    if any(not (type(i) is int and 0 <= i < 2 ** 63) for i in span["ids"]):
                        self.hashed_strata.add(span["stratum"])
                    positions.update(position_of(i) for i in span["ids"])
                for item in span.get("ranges", []):
                    positions.update(range(*item))
        self.updates = {}
        self.times = {}
        for rec in run.ledger:
            self.updates.setdefault(rec.attempt, set()).add(rec.update)
            old = self.times.get((rec.attempt, rec.update))
            self.times[(rec.attempt, rec.update)] = rec.time if old is None else min(old, rec.time)

    # ------------------------------------------------------------------ lineage
    def resume(self, k):
        """(kind, U, writer, declared, cursor, generation_id)"""
        record = self.attempts.get(k)
        first = min(self.attempts)
        if record is None or record.resumed_from is None:
            if (k == first == 0 and not self.unseen(k)) \
                    or (record is not None and record.started_at is not None):
                return ("fresh", 0, None, None, [], None)
            return ("untracked", 0, None, None, [], None)
        source = record.resumed_from
        declared = source.get("update") or 0
        gid = source.get("generation_id")
        gen = self.generations.get(gid)
        writer = self.writer(gen) if gen is not None else None
        if gen is not None and writer < k:
            u = gen.manifests[0]["update"] if gen.manifests else gen.update
            return ("generation", declared if u is None else u, writer, declared,
                    source.get("cursor") or [], gid)
        return ("untracked", declared, None, declared, source.get("cursor") or [], gid)

    def after(self, k):
        """Refinement (renumbered updates): where k's own updates start (exclusive): U, or its
        lowest committed update - 1 when k resumed (not fresh) and numbers its updates from at
        or below U."""
        kind, u, *_ = self.resume(k)
        ups = self.updates.get(k)
        if kind != "fresh" and ups and min(ups) <= u:
            return min(ups) - 1
        return u

    def unseen(self, k):
        """Refinement (resume from a generation the server had not seen): nothing of attempt k
        arrived (no attempt_started, no resume, no committed update) but it wrote a
        generation."""
        record = self.attempts.get(k)
        started = record is not None and (record.started_at is not None
                                          or record.resumed_from is not None)
        return not started and not self.updates.get(k) \
            and any(self.writer(g) == k for g in self.generations.values())

    @staticmethod
    def data_cursor(gen):
        return list((gen.manifests[0].get("data_progress") or {}).get("cursor") or []) \
            if gen.manifests else []

    def complete(self, a, u):
        """Refinement (updates counted once complete): a coordinator's report or world_size
        distinct data-parallel ranks (any report when the world size is unknown)."""
        ranks = {r for (aa, uu, r) in self.reports if aa == a and uu == u}
        size = getattr(self.attempts.get(a), "world_size", None)
        return None in ranks or not size or len(ranks) >= size

    def settled_top(self, a):
        """None: every update of ``a`` settled; else the highest settled one (-1: none)."""
        record = self.attempts.get(a)
        ups = self.updates.get(a, set())
        if record is None or not record.world_size or a != max(self.attempts) or not ups:
            return None
        tops = [u for u in ups if self.complete(a, u)]
        if self.now is not None:
            tops += [u for u in ups if self.times[(a, u)] <= self.now - self.settle]
        top = max(tops, default=-1)
        return None if top >= max(ups) else top

    def settled(self, a, u):
        top = self.settled_top(a)
        return top is None or u <= top

    def writer(self, gen):
        """Refinement (writer of a generation): the manifest's attempt, else the attempt that
        started or wrote a shard of it, else the newest attempt at or below the reporting one
        that committed the generation's update."""
        named = gen.manifests[0].get("attempt") if gen.manifests else None
        if type(named) is int and named in self.attempts:
            return named
        if gen.started_at is not None or gen.shards:
            return gen.attempt
        u = gen.manifests[0]["update"] if gen.manifests else gen.update
        if type(u) is not int or u <= 0:
            return gen.attempt
        holders = [a for a, us in self.updates.items() if a <= gen.attempt and u in us]
        return max(holders) if holders else gen.attempt

    def lineage(self, k, cap=None):
        """[(attempt, after, upto)] newest first, and the pre-tracking cursors."""
        kind, u, writer, _, cursor, _ = self.resume(k)
        own = (k, self.after(k), cap)
        if kind == "generation":
            # a cap is in k's own numbering: the restored state is older than every update
            # of k when k renumbered its updates
            renumbered = self.after(k) != u
            segments, pre = self.lineage(writer, u if cap is None or renumbered
                                         else min(cap, u))
            if self.unseen(writer):  # what it consumed before U: the generation's cursor
                pre = self.data_cursor(self.generations[self.resume(k)[5]])
            return [own] + segments, pre
        return [own], (cursor if kind == "untracked" else [])

    @classmethod
    def commit_order(cls, segments, attempt, update):
        """Refinement (renumbered updates): where a held update lies in the lineage's order of
        commit: (its segment from the oldest, its update); None when not held."""
        for i, seg in enumerate(segments):
            if cls.holds(seg, attempt, update):
                return (len(segments) - 1 - i, update)
        return None

    @staticmethod
    def holds(segment, attempt, update):
        a, after, upto = segment
        return a == attempt and after < update and (upto is None or update <= upto)

    def multiset(self, segments, pre):
        """{key: Counter(position -> count)} of a lineage."""
        out = {}
        for (a, u, _r), keyed in self.reports.items():
            if any(self.holds(seg, a, u) for seg in segments):
                for key, positions in keyed.items():
                    counter = out.setdefault(key, Counter())
                    for p in positions:
                        counter[p] += 1
        for c in pre:
            if c["stratum"] in self.id_strata or c.get("position", 0) <= 0:
                continue
            counter = out.setdefault((c["stratum"], c.get("epoch", 0), c.get("order")), Counter())
            for p in range(c["position"]):
                counter[p] += 1
        return out

    def epoch_length(self, stratum):
        for a in sorted(self.attempts, reverse=True):
            record = self.attempts[a]
            lengths = ((record.sampler if record else None) or {}).get("epoch_length") or {}
            if stratum in lengths:
                return lengths[stratum]
        return None

    def batch(self, attempt):
        record = self.attempts.get(attempt)
        if record is None:
            return None
        if record.global_batch_size:
            return record.global_batch_size
        if record.micro_batch_size and record.grad_accum_steps and record.world_size:
            return record.micro_batch_size * record.grad_accum_steps * record.world_size
        return None

    def root(self, k):
        kind, u, writer, *_ = self.resume(k)
        return self.root(writer) if kind == "generation" else k

    def floors(self, k, cap=None, segments=None, pre=None):
        """Refinement (unknown root): {key: floor}. When the lineage's root started untracked,
        each stratum's tracking starts at the lineage's first update consuming it; the keys
        consumed there get their smallest position as floor, unless a cursor names the stratum
        (then only keys of a named (stratum, epoch) under an order no cursor names)."""
        if self.resume(self.root(k))[0] != "untracked":
            return {}
        if segments is None:
            segments, pre = self.lineage(k, cap)
        named = {}
        for c in pre:
            named.setdefault(c["stratum"], set()).add((c.get("epoch", 0), c.get("order")))
        held = [(a, self.commit_order(segments, a, u), keyed)
                for (a, u, r), keyed in self.reports.items()
                if any(self.holds(seg, a, u) for seg in segments)]
        first = {}
        for _a, u, keyed in held:
            for (s, _e, _o), positions in keyed.items():
                if positions and s not in self.id_strata:
                    first[s] = min(first.get(s, u), u)
        out = {}
        for _a, u, keyed in held:
            for (s, e, o), positions in keyed.items():
                if not positions or s in self.id_strata or first[s] != u:
                    continue
                cursors = named.get(s)
                if cursors is None or ((e, o) not in cursors and any(ce == e for ce, _ in cursors)):
                    out[(s, e, o)] = min(out.get((s, e, o), min(positions)), min(positions))
        return out

    def untracked_ids(self, k, segments=None):
        """Refinement (unknown root), sample-id strata: the keys each id stratum consumed at the
        lineage's first update of it; their earlier ids are unknown, so none is owed."""
        if self.resume(self.root(k))[0] != "untracked":
            return set()
        if segments is None:
            segments, _ = self.lineage(k)
        held = [(self.commit_order(segments, a, u), keyed)
                for (a, u, r), keyed in self.reports.items()
                if any(self.holds(seg, a, u) for seg in segments)]
        first = {}
        for u, keyed in held:
            for (s, _e, _o), positions in keyed.items():
                if positions and s in self.id_strata:
                    first[s] = min(first.get(s, u), u)
        return {key for u, keyed in held for key, positions in keyed.items()
                if positions and key[0] in first and first[key[0]] == u}

    def owed_ids(self, ids, stratum, batch):
        """Integer ids of [0, epoch_length) not in ``ids``, under the tail rule."""
        length = self.epoch_length(stratum)
        missing = sum(1 for i in range(length) if i not in ids)
        return 0 if missing <= 0 or (batch is not None and missing < batch) else missing

    def batch_of_key(self, segments, key, root):
        for seg in segments:
            for (a, u, _r), keyed in self.reports.items():
                if self.holds(seg, a, u) and key in keyed:
                    return self.batch(seg[0])
        return self.batch(root)

    def leaving_batch(self, segments, pre, stratum, epoch, root):
        """Refinement (drop-last threshold): the global batch of the attempt that left
        ``epoch``: the one holding the lineage's earliest update consuming a later epoch of the
        stratum (the root's when its pre-tracking cursor stands in a later epoch)."""
        if any(c["stratum"] == stratum and c.get("epoch", 0) > epoch for c in pre):
            return self.batch(root)
        found = [(self.commit_order(segments, a, u), a) for (a, u, r), keyed in self.reports.items()
                 if any(self.holds(seg, a, u) for seg in segments)
                 and any(s == stratum and e > epoch and ps for (s, e, o), ps in keyed.items())]
        return self.batch(min(found)[1]) if found else None

    def tail(self, frontier, stratum, batch):
        length = self.epoch_length(stratum)
        if length is None:
            return 0
        tail = length - frontier
        if tail <= 0 or (batch is not None and tail < batch):
            return 0
        return tail

    # ------------------------------------------------------------------ epochs
    def key_ids(self, segments, pre, key, counter):
        """Refinement (epochs under several orders): the sample identities a lineage consumed
        at ``key``: the ids of an id stratum; else the indices its reports named, None when a
        report of the key named none or positions lie behind a pre-tracking cursor."""
        s, e, o = key
        if s in self.id_strata:
            return set(counter)
        out = set()
        if any(c["stratum"] == s and c.get("epoch", 0) == e and c.get("order") == o
               and c.get("position", 0) > 0 for c in pre):
            out = None
        for (a, u, r), keyed in self.reports.items():
            if out is not None and keyed.get(key) and any(self.holds(seg, a, u)
                                                          for seg in segments):
                named = self.indices[(a, u, r)].get(key)
                out = None if named is None else out | named
        if out is None:
            return self.recreated_ids(key, counter)
        return out

    def recreated_ids(self, key, counter):
        """Refinement (re-created orders): under a DistributedSampler order that an attempt's
        declared settings name (sha256 of their canonical JSON), the indices
        ``torch.randperm(n, seed + epoch)`` puts at the consumed positions; None for any other
        order, or a position at or past n."""
        s, e, o = key
        for a in sorted(self.attempts, reverse=True):
            record = self.attempts[a]
            sampler = (record.sampler if record else None) or {}
            lengths = sampler.get("epoch_length")
            n = lengths.get(s) if isinstance(lengths, dict) else None
            seed, shuffle = sampler.get("seed"), sampler.get("shuffle")
            if sampler.get("algorithm") != DISTRIBUTED_SAMPLER or type(seed) is not int \
                    or type(shuffle) is not bool or type(n) is not int:
                continue
            for version in (record.dataset_version, None):
                doc = {"algorithm": DISTRIBUTED_SAMPLER, "dataset_length": n,
                       "dataset_version": version, "epoch": e, "seed": seed,
                       "shuffle": shuffle}
                text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
                if hashlib.sha256(text.encode()).hexdigest()[:32] != o:
                    continue
                held = [p for p, c in counter.items() if c > 0]
                if any(p >= n for p in held):
                    return None
                perm = torch_randperm(n, seed + e) if shuffle else list(range(n))
                return {perm[p] for p in held}
        return None

    def newest_key(self, segments, keys):
        for seg in segments:  # newest first
            firsts = {}
            for (a, u, _r), keyed in self.reports.items():
                if self.holds(seg, a, u):
                    for key in keys:
                        if keyed.get(key):
                            firsts[key] = min(firsts.get(key, u), u)
            if firsts:
                return max((firsts[k], i, k) for i, k in enumerate(keys) if k in firsts)[2]
        return keys[-1]

    def holes(self, counter, floor):
        return sum(1 for p in range(floor, max(counter) + 1) if counter[p] == 0) if counter else 0

    def epoch_count(self, k, segments, pre, counts, keys, moved_on, untracked):
        """(duplicates across orders, omissions, known, undetermined) of one (stratum, epoch)
        of a lineage, brute force: along the order for one order, by identity for several."""
        s, e = keys[0][0], keys[0][1]
        length = self.epoch_length(s)
        root = self.root(k)
        floors = self.floors(k, segments=segments, pre=pre)
        if len(keys) == 1:
            key = keys[0]
            counter = counts[key]
            om = 0
            if s not in self.id_strata:
                om = self.holes(counter, floors.get(key, 0))
                # refinement (unknown root): no tail for a key reached only through the cursor
                if moved_on and key in set(self.multiset(segments, [])):
                    om += self.tail(max(counter) + 1, s,
                                    self.leaving_batch(segments, pre, s, e, root))
            elif s not in self.hashed_strata and moved_on and length and key not in untracked:
                om = self.owed_ids(set(counter), s, self.leaving_batch(segments, pre, s, e, root))
            return 0, om, True, 0
        last = self.newest_key(segments, keys)
        ids = {key: self.key_ids(segments, pre, key, counts[key]) for key in keys}
        batch = self.leaving_batch(segments, pre, s, e, root) if moved_on else None
        last_tail = (length - (max(counts[last]) + 1)) if length is not None else 0
        exempt = last_tail if moved_on and batch is not None and 0 < last_tail < batch else 0
        known = [v for v in ids.values() if v is not None]
        union = set().union(*known)
        dup = sum(len(v) for v in known) - len(union)  # samples fed twice among known orders
        if len(known) < len(ids):
            if s in self.hashed_strata or not moved_on or not length or length <= 0:
                return dup, 0, False, 0
            distinct = sum(len(counts[key]) for key in keys)
            return dup, max(0, length - distinct - exempt), False, 0
        if s in self.hashed_strata or any(key in untracked for key in keys):
            return dup, 0, True, 0
        if s in self.id_strata:
            om = self.owed_ids(union, s, batch) if moved_on and length and length > 0 else 0
            return dup, om, True, 0
        if moved_on and length is not None and length > 0:
            missing = sum(1 for i in range(length) if i not in union)
            return dup, max(0, missing - exempt), True, 0
        gaps = self.holes(counts[last], floors.get(last, 0))
        others = len(union - ids[last])
        return dup, max(0, gaps - others), True, min(gaps, others)

    def epochs_of(self, counts):
        grouped = {}
        for key in counts:
            grouped.setdefault(key[:2], []).append(key)
        for keys in grouped.values():
            keys.sort(key=lambda k: "" if k[2] is None else k[2])
        top = {}
        for (s, e) in grouped:
            top[s] = max(top.get(s, e), e)
        return grouped, top

    # ------------------------------------------------------------------ counting
    def strata(self, k):
        segments, pre = self.lineage(k)
        capped = []
        for a, after, upto in segments:  # refinement: only settled updates count
            top = self.settled_top(a)
            if top is not None and (upto is None or top < upto):
                upto = max(top, after)
            capped.append((a, after, upto))
        segments = capped
        counts = self.multiset(segments, pre)
        # refinement (unknown root): a key reached only through the root's cursor was before the
        # resume: neither its tail nor a whole epoch skipped after it is owed
        tracked = set(self.multiset(segments, []))
        untracked = self.untracked_ids(k)
        grouped, top = self.epochs_of(counts)
        rows = {}
        for (s, e), keys in grouped.items():
            row = rows.setdefault(s, {"stratum": s, "consumed": 0, "duplicates": 0,
                                      "omissions": 0, "distinct": 0})
            for key in keys:
                counter = counts[key]
                row["consumed"] += sum(counter.values())
                row["duplicates"] += sum(c - 1 for c in counter.values() if c > 1)
                row["distinct"] += len(counter)
            # refinement (epochs under several orders): one order along its positions, several
            # by sample identity; integer ids of an epoch moved on from under the tail rule
            dup, om, _known, _und = self.epoch_count(k, segments, pre, counts, keys, e < top[s],
                                                     untracked)
            row["duplicates"] += dup
            row["distinct"] -= dup
            row["omissions"] += om
        # refinement: a whole epoch skipped between consumed epochs of a stratum (any order)
        for s in rows:
            length = self.epoch_length(s)
            if length and (s not in self.id_strata or s not in self.hashed_strata):
                seen = {e for (s2, e, o) in counts if s2 == s and (s2, e, o) in tracked}
                if not seen:
                    continue
                missing = [e for e in range(min(seen), max(seen) + 1) if e not in seen]
                rows[s]["omissions"] += len(missing) * length
        out = []
        for s in sorted(rows):
            row = rows[s]
            distinct = row.pop("distinct")
            row["duplicate_rate"] = row["duplicates"] / row["consumed"] if row["consumed"] else 0.0
            total = row["omissions"] + distinct
            row["omission_rate"] = row["omissions"] / total if total else 0.0
            row["units"] = self.units(s)
            out.append(row)
        return out

    def units(self, stratum):
        """docs/definitions.md#units: the newest attempt's declared unit, else samples."""
        for a in sorted(self.attempts, reverse=True):
            record = self.attempts[a]
            declared = ((record.sampler if record else None) or {}).get("units") or {}
            if stratum in declared:
                return "tokens" if declared[stratum] == "tokens" else "samples"
        return "samples"

    def frontiers(self, counts):
        return {key: max(c) + 1 for key, c in counts.items() if c}

    def cursor(self, counts):
        best = {}
        for (s, e, _o), top in self.frontiers(counts).items():
            if s in self.id_strata:
                continue
            if s not in best or (e, top) > best[s]:
                best[s] = (e, top)
        return [{"stratum": s, "epoch": e, "position": p} for s, (e, p) in sorted(best.items())]

    # ------------------------------------------------------------------ restarts
    def own_positions(self, k, after):
        out = {}
        for (a, u, _r), keyed in self.reports.items():
            if a == k and u > after:
                for key, positions in keyed.items():
                    out.setdefault(key, set()).update(positions)
        return out

    def starts(self, k, after):
        first = {}
        for (a, u, _r), keyed in self.reports.items():
            if a != k or u <= after:
                continue
            for (s, e, o), positions in keyed.items():
                item = (u, e, min(positions), "" if o is None else o, o)
                if s not in first or item < first[s]:
                    first[s] = item
        return first

    def restart(self, before, k):
        kind, U, writer, declared, cursor, gid = self.resume(k)
        segments, pre = self.lineage(k)
        parent = self.multiset(segments[1:], pre)
        own_after = self.after(k)
        K = self.own_positions(k, own_after)
        starts = self.starts(k, own_after)
        floors = self.floors(k)
        replayed = sum(len(K[key] & set(parent[key])) for key in K if key in parent)
        omitted = 0
        untracked = self.untracked_ids(k)
        # refinement (epochs under several orders): an epoch k's lineage consumed under
        # several orders is compared by identity, never along positions
        after_counts = self.multiset(segments, pre)
        after_grouped, after_top = self.epochs_of(after_counts)
        mixed = {se for se, keys in after_grouped.items() if len(keys) > 1}
        for s, (_u, e1, s1, _, o1) in starts.items():
            if s in self.id_strata:
                keys = [key for key in parent if key[0] == s]
                if s in self.hashed_strata or not self.epoch_length(s) or not keys:
                    continue
                e0 = max(key[1] for key in keys)
                length = self.epoch_length(s)
                if e1 == e0:
                    key = (s, e1, o1)
                    if key in parent and key not in untracked and (s, e1) not in mixed \
                            and any(k2[0] == s and k2[1] > e1 for k2 in K):
                        omitted += self.owed_ids(set(parent[key]) | K.get(key, set()), s,
                                                 self.leaving_batch(segments, pre, s, e1,
                                                                    self.root(k)))
                elif e1 > e0:
                    for key in keys:
                        if key[1] == e0 and key not in untracked and (s, e0) not in mixed:
                            omitted += self.owed_ids(set(parent[key]), s, self.leaving_batch(
                                segments, pre, s, e0, self.root(k)))
                    omitted += length * sum(1 for e in range(e0 + 1, e1)
                                            if not any(k2[0] == s and k2[1] == e for k2 in K))
                continue
            mine = K.get((s, e1, o1), set())
            floor = floors.get((s, e1, o1), 0)
            keys = [key for key in parent if key[0] == s]
            new_gap = 0 if (s, e1) in mixed else \
                sum(1 for p in range(floor, s1) if p not in mine)
            if not keys:
                omitted += new_gap
                continue
            e0 = max(key[1] for key in keys)
            f0 = max(max(parent[key]) + 1 for key in keys if key[1] == e0)
            if e1 == e0:
                if (s, e1, o1) in parent and (s, e1) not in mixed:
                    omitted += sum(1 for p in range(max(f0, floor), s1) if p not in mine)
                    key = (s, e1, o1)
                    if any(k2[0] == s and k2[1] > e1 for k2 in K):  # k left the epoch
                        reached = max([max(parent[key]) + 1] * bool(parent.get(key))
                                      + [max(mine) + 1] * bool(mine) + [0])
                        omitted += self.tail(reached, s, self.leaving_batch(
                            segments, pre, s, e1, self.root(k)))
            elif e1 > e0:
                if (s, e0) not in mixed:
                    omitted += self.tail(f0, s, self.leaving_batch(segments, pre, s, e0,
                                                                   self.root(k)))
                length = self.epoch_length(s)
                if length:
                    omitted += length * sum(1 for e in range(e0 + 1, e1)
                                            if not any(key[0] == s and key[1] == e for key in K))
                omitted += new_gap
        unknown, undetermined = [], False
        parent_grouped, parent_top = self.epochs_of(parent)
        for s, e in sorted(mixed):
            moved = (e < after_top[s], e < parent_top.get(s, e))
            if not any(key[:2] == (s, e) for key in K) and moved[0] == moved[1]:
                continue  # k neither consumed the epoch nor left it
            dup1, om1, known1, und1 = self.epoch_count(
                k, segments, pre, after_counts, after_grouped[(s, e)], moved[0],
                self.untracked_ids(k, segments))
            dup0, om0 = 0, 0
            if (s, e) in parent_grouped:
                dup0, om0, _k0, _u0 = self.epoch_count(
                    k, segments[1:], pre, parent, parent_grouped[(s, e)], moved[1],
                    self.untracked_ids(k, segments[1:]))
            omitted += max(0, om1 - om0)
            if not known1:
                unknown.append((s, e))
                continue
            replayed += max(0, dup1 - dup0)
            undetermined = undetermined or und1 > 0
        # recomputed
        p_segments = [seg for seg in segments if seg[0] == before]
        rolled = {}
        for (a, u, _r), keyed in self.reports.items():
            if a == before and not any(self.holds(seg, a, u) for seg in p_segments):
                for key, positions in keyed.items():
                    rolled.setdefault(key, set()).update(positions)
        fetched = [c for b in self.run.heartbeats if b.attempt == before for c in b.fetched]
        record_before = self.attempts.get(before)
        if record_before is not None:
            fetched += list(record_before.end_fetched or [])
        recomputed = 0
        for key, positions in K.items():
            s, e, o = key
            bound = max([c["position"] for c in fetched if c["stratum"] == s
                         and c.get("epoch", 0) == e and c.get("order", o) == o] or [0])
            pool = rolled.get(key, set()) | set(range(bound))
            pool -= set(parent.get(key, {}))
            recomputed += len(positions & pool)
        last_candidates = [x for x in (max(self.updates.get(before, set()), default=None),
                                       record_before.end_update if record_before else None)
                           if x is not None]
        last = max(last_candidates) if last_candidates else U
        committed = any(u > own_after for u in self.updates.get(k, ()))
        if committed:  # the first update counts once every rank's part of it is in
            first = min(u for u in self.updates[k] if u > own_after)
            if not self.complete(k, first):
                # refinement: decided once settled, omitted beyond the missing part's room
                committed = self.settled(k, first)
                if committed:
                    size = self.attempts[k].world_size
                    present = {r for (a, u, r) in self.reports if a == k and u == first
                               and r is not None and r >= 0}
                    missing = max(len([r for r in range(size) if r not in present]),
                                  size - len(present))
                    consumed = sum(len(p) for (a, u, r), keyed in self.reports.items()
                                   if a == k and u == first for p in keyed.values())
                    share = -(-consumed // len(present)) if present else 0
                    omitted = max(0, omitted - missing * share)
        unproven = kind == "generation" and self.unseen(writer) and bool(
            {key[0] for key in K} - {c["stratum"] for c in self.data_cursor(
                self.generations[gid])})
        if not committed or kind == "untracked" or unknown or unproven:
            verdict = "unverified"
        elif replayed and omitted:
            verdict = "replay_and_omission"
        elif replayed:
            verdict = "replay"
        elif omitted:
            verdict = "omission"
        elif undetermined:
            verdict = "unverified"
        else:
            verdict = "exact"
        orders = {}
        for (s, e, o) in parent:
            orders.setdefault((s, e), set()).add(o)
        order_changed = any((s, e) in orders and o not in orders[(s, e)] for (s, e, o) in K)
        if cursor:
            resume_cursor = [{"stratum": c["stratum"], "epoch": c.get("epoch", 0),
                              "position": c.get("position", 0)} for c in cursor]
        else:
            resume_cursor = [{"stratum": s, "epoch": e, "position": p}
                             for s, (u, e, p, _, o) in sorted(starts.items())]
        codes = set()
        if replayed:
            codes.add("replay")
        if omitted:
            codes.add("omission")
        if order_changed:
            codes.add("order_changed")
        if kind == "untracked":
            codes.add("resumed_from_unknown")
        if (kind == "generation" and declared != U) \
                or (self.updates.get(k) and min(self.updates[k]) != U + 1):
            codes.add("update_mismatch")
        if committed and unknown:
            codes.add("samples_unknown")
        if committed and undetermined:
            codes.add("samples_undetermined")
        return {"attempt": k, "resumed_from": gid, "resumed_update": U,
                "expected_cursor": self.cursor(parent), "resume_cursor": resume_cursor,
                "replayed": replayed, "omitted": omitted, "recomputed": recomputed,
                "lost_updates": 0 if kind == "untracked" and declared is None else max(0, last - U),
                "verdict": verdict, "codes": codes}

    def restarts(self):
        numbers = sorted(self.attempts)
        out = [self.restart(b, k) for b, k in zip(numbers, numbers[1:], strict=False)]
        first = self.first_restart(numbers[0]) if numbers else None
        return ([first] if first else []) + out

    def first_restart(self, k):
        """Refinement: the first attempt heard of already resumed (a resume declared, or
        numbered above 0 without attempt_started): unverified, nothing counted."""
        kind, U, _w, _d, cursor, gid = self.resume(k)
        record = self.attempts[k]
        if kind != "untracked" or self.unseen(k) or (k == 0 and record.resumed_from is None):
            return None
        starts = self.starts(k, self.after(k))
        resume_cursor = [{"stratum": c["stratum"], "epoch": c.get("epoch", 0),
                          "position": c.get("position", 0)} for c in cursor] if cursor else [
            {"stratum": s, "epoch": e, "position": p}
            for s, (u, e, p, _, o) in sorted(starts.items())]
        return {"attempt": k, "resumed_from": gid, "resumed_update": U, "expected_cursor": [],
                "resume_cursor": resume_cursor, "replayed": 0, "omitted": 0, "recomputed": 0,
                "lost_updates": 0, "verdict": "unverified",
                "codes": {"resumed_from_unknown"} if record.resumed_from is not None else set()}

    def expected_cursor_at(self, attempt, update):
        segments, pre = self.lineage(attempt, update)
        return self.cursor(self.multiset(segments, pre))

    def epoch_complete_at(self, attempt, update, stratum):
        """Whether the expected cursor's epoch of ``stratum`` at (attempt, update) has no tail
        left under the tail rule, with the global batch of the lineage attempt that consumed the
        cursor's key (the drop_last remainder is complete)."""
        segments, pre = self.lineage(attempt, update)
        frontiers = self.frontiers(self.multiset(segments, pre))
        keys = [(e, top, "" if o is None else o, (s, e, o)) for (s, e, o), top in frontiers.items()
                if s == stratum and s not in self.id_strata]
        if not keys or self.epoch_length(stratum) is None:
            return False
        _e, top, _o, key = max(keys)
        return self.tail(top, stratum, self.batch_of_key(segments, key, self.root(attempt))) == 0

    @staticmethod
    def place(segments, attempt, update):
        """Refinement (renumbered updates): a state's place on a lineage, (its segment from the
        oldest, its update); None off the lineage. Segments newest first."""
        for i, (a, after, upto) in enumerate(segments):
            if a == attempt and after <= update and (upto is None or update <= upto):
                return (len(segments) - 1 - i, update)
        return None

    def updates_at_risk(self, gen):
        """Updates of the live lineage committed after the state of ``gen`` (None: all), by
        place on the lineage: every update of a newer segment, and those of its own segment
        above its update."""
        segments, _ = self.lineage(max(self.attempts))
        where = None if gen is None else self.place(segments, gen.attempt, gen.update)
        out = 0
        for i, seg in enumerate(segments):
            number = len(segments) - 1 - i
            for u in self.updates.get(seg[0], ()):
                if not self.holds(seg, seg[0], u):
                    continue
                if gen is None or number > where[0] or (number == where[0] and u > gen.update):
                    out += 1
        return out
