#!/usr/bin/env bash
# Run an hvdx example (any Horovod script) across several hosts, with the topology
# variables hvdx reads.
#
#   examples/multi_host.sh [--dry-run] [--launcher horovodrun|mpirun] [--hosts H1,H2,...]
#       [--slots N] [--racks R1,R2,...] [--link-rates NIC,UPLINK] [-- COMMAND...]
#
#   --hosts       the hosts, as the launcher reaches them (default: print an example)
#   --slots       ranks per host (4)
#   --racks       each host's rack, in the order of --hosts (default: every host is its
#                 own rack); any strings, a switch name for instance
#   --link-rates  a host's NIC rate and a rack uplink's, e.g. 25gbit,100gbit: DS-Sync
#                 picks its rotation from them (`hvdx topology --probe` measures both)
#   COMMAND       default: python examples/torch_digits.py --strategy dssync
#
# Without --hosts, or with --dry-run, it prints the command of each launcher and runs
# nothing. Otherwise it runs the command with horovodrun (default) or MPICH's mpirun:
#
#   horovodrun -np 8 -H host1:4,host2:4 bash examples/multi_host.sh --set-rack -- COMMAND
#   mpirun -n 8 -hosts host1,host2 -ppn 4 bash examples/multi_host.sh --set-rack -- COMMAND
#
# Both launchers pass the environment of this shell to every rank, HVDX_LINK_RATES and
# MULTI_HOST_RACKS (host=rack,...) included; on each rank, `--set-rack` exports that host's
# HVDX_RACK and then runs COMMAND. hvdx wants HVDX_RACK on every rank or on none, so a
# host missing from MULTI_HOST_RACKS stops the job. Every host needs passwordless ssh, this
# repository and hvdx's environment at the same paths (`bash scripts/setup` on each,
# or a shared HVDX_HOME), and the same names for itself (`hostname`) as in --hosts;
# horovodrun's Gloo mode passes the name from -H instead (HOROVOD_HOSTNAME).
set -euo pipefail

if [[ "${1:-}" == "--set-rack" ]]; then  # on every rank, started by the launcher
  shift
  [[ "${1:-}" == "--" ]] && shift
  rack="" MULTI_HOST_RACKS="${MULTI_HOST_RACKS:-}"
  for name in "${HOROVOD_HOSTNAME:-}" "$(hostname)" "$(hostname -s)"; do
    for pair in ${MULTI_HOST_RACKS//,/ }; do
      if [[ -n "$name" && "${pair%%=*}" == "$name" ]]; then rack="${pair#*=}"; break 2; fi
    done
  done
  if [[ -z "$rack" ]]; then
    echo "multi_host.sh: host $(hostname) is not in MULTI_HOST_RACKS=$MULTI_HOST_RACKS" >&2
    exit 1
  fi
  export HVDX_RACK="$rack"
  exec "$@"
fi

dry_run=0 launcher=horovodrun hosts="" slots=4 racks="" link_rates=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --launcher) launcher="$2"; shift ;;
    --hosts) hosts="$2"; shift ;;
    --slots) slots="$2"; shift ;;
    --racks) racks="$2"; shift ;;
    --link-rates) link_rates="$2"; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "multi_host.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
if [[ -z "$hosts" ]]; then  # an example to print
  dry_run=1 hosts=host1,host2
  racks="${racks:-rack1,rack2}" link_rates="${link_rates:-25gbit,100gbit}"
fi
command=("$@")
[[ ${#command[@]} -gt 0 ]] || command=(python examples/torch_digits.py --strategy dssync)
case "$launcher" in horovodrun|mpirun) ;; *)
  echo "multi_host.sh: --launcher must be horovodrun or mpirun" >&2; exit 2 ;;
esac

IFS=, read -r -a host_list <<< "$hosts"
IFS=, read -r -a rack_list <<< "${racks:-$hosts}"  # default: a rack per host
if [[ ${#rack_list[@]} -ne ${#host_list[@]} ]]; then
  echo "multi_host.sh: ${#host_list[@]} hosts but ${#rack_list[@]} racks" >&2
  exit 2
fi
pairs=() slots_list=()
for i in "${!host_list[@]}"; do
  pairs+=("${host_list[$i]}=${rack_list[$i]}")
  slots_list+=("${host_list[$i]}:$slots")
done
np=$((${#host_list[@]} * slots))
racks_value="$(IFS=,; echo "${pairs[*]}")"
host_slots="$(IFS=,; echo "${slots_list[*]}")"
rank_command=(bash "$0" --set-rack -- "${command[@]}")
declare -A launch=(
  [horovodrun]="horovodrun -np $np -H $host_slots"
  [mpirun]="mpirun -n $np -hosts $hosts -ppn $slots")
environment="MULTI_HOST_RACKS=$racks_value${link_rates:+ HVDX_LINK_RATES=$link_rates}"

quoted="$(printf '%q ' "${rank_command[@]}")"
if [[ $dry_run -eq 1 ]]; then
  echo "# horovodrun:"
  echo "$environment ${launch[horovodrun]} ${quoted% }"
  echo "# MPICH's mpirun (Hydra):"
  echo "$environment ${launch[mpirun]} ${quoted% }"
  exit 0
fi
export MULTI_HOST_RACKS="$racks_value"
[[ -z "$link_rates" ]] || export HVDX_LINK_RATES="$link_rates"
read -r -a launcher_args <<< "${launch[$launcher]}"
echo "+ $environment ${launch[$launcher]} ${quoted% }" >&2
exec "${launcher_args[@]}" "${rank_command[@]}"
