#!/usr/bin/env bash
# train --trace under mpirun -np 2 writes one Chrome trace-event file holding both ranks (a
# process per rank, named): on each rank's main thread the steps with their forward, autograd's
# backward, DDP's end-of-backward wait and the optimizer step; the collectives on its
# communication thread (or, in caller-progress mode, their starts on the main thread); each bucket an async span whose begin and end pair up; every thread's
# spans nested. Without MPIRUN the single process is checked the same way.
# Usage: check_train_trace.sh TRAIN [MPIRUN]
source "$(dirname "$0")/train_check_setup.sh"
steps=5
# --bucket-cap-mb 0.01: the MLP's six parameters make several buckets.
"${launch[@]}" "$train" --data synthetic --model mlp --samples 1280 --hidden 64 --progress lines --target 0 \
  --steps $steps --bucket-cap-mb 0.01 --trace "$work/trace.json" >"$work/log" 2>&1 || {
  echo "FAIL: train exited with status $?:"
  sed 's/^/    /' "$work/log"
  exit 1
}
"$py" - "$work/trace.json" "$ranks" "$steps" <<'EOF'
import collections, json, sys
path, ranks, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
errors = []
events = json.load(open(path))['traceEvents']
procs = {e['pid']: e['args']['name'] for e in events if e['ph'] == 'M' and e['name'] == 'process_name'}
threads = {(e['pid'], e['tid']): e['args']['name'] for e in events if e['ph'] == 'M' and e['name'] == 'thread_name'}
if procs != {r: f'rank {r}' for r in range(ranks)}:
    errors.append(f'processes {procs}, want ranks 0..{ranks - 1}')
spans = collections.defaultdict(list)   # (pid, tid) -> [(begin, end, name)]
count = collections.Counter()            # (thread name, span name)
asyncs = collections.defaultdict(list)  # (pid, name, id) -> phases
for e in events:
    if e['ph'] == 'X':
        key = (e['pid'], e['tid'])
        spans[key].append((e['ts'], e['ts'] + e['dur'], e['name']))
        count[(threads.get(key, '?'), e['name'])] += 1
    elif e['ph'] in 'be':
        asyncs[(e['pid'], e['name'], e['id'])].append(e['ph'])
for key, lst in spans.items():
    lst.sort(key=lambda s: (s[0], -s[1]))
    open_ = []
    for b, end, name in lst:
        while open_ and open_[-1][1] <= b:
            open_.pop()
        if open_ and end > open_[-1][1]:
            errors.append(f'{threads.get(key)}: {name} [{b}, {end}] overlaps {open_[-1][2]} partially')
            break
        open_.append((b, end, name))
for r in range(ranks):
    main, comm = f'rank {r} main', f'rank {r} comm world'
    for name in ['step', 'forward + loss', 'ddp forward', 'backward', 'ddp finalize', 'ddp wait for buckets',
                 'optimizer step']:
        if count[(main, name)] != steps:
            errors.append(f'{main}: {count[(main, name)]} "{name}" spans, want {steps}')
    # Thread progress runs the buckets' allreduces on the communication thread; caller progress
    # starts each on the main thread (the span of its start) and polls it from there.
    allreduces = count[(comm, 'allreduce')] + count[(main, 'allreduce')]
    if ranks > 1 and allreduces < 2 * steps:
        errors.append(f'rank {r}: {allreduces} allreduce spans on its main and communication threads, '
                      f'want at least {2 * steps}')
buckets = collections.Counter()
for (pid, name, id_), phases in asyncs.items():
    if not name.startswith('bucket ') or sorted(phases) != ['b', 'e']:
        errors.append(f'rank {pid}: async span {name} id {id_} has phases {phases}')
    buckets[pid] += 1
for r in range(ranks):
    if buckets[r] < 2 * steps:
        errors.append(f'rank {r}: {buckets[r]} bucket spans in {steps} steps, want at least {2 * steps}')
for e in errors:
    print('FAIL:', e)
if not errors:
    print(f'ok: {len(events)} events from {ranks} rank(s), {sum(buckets.values())} bucket spans, '
          f'threads: {sorted(set(threads.values()))}')
sys.exit(1 if errors else 0)
EOF
