# gpu-pivot: bash completion for `invoke` and `inv` (task names, flags, and host aliases after
# --host / -H). Invoke's own script (`invoke --print-completion-script bash`) completes tasks
# and flags but leaves a flag's value to file names; this one asks `invoke hosts --names`
# for the aliases of hosts.env and the built-ins. Load it from ~/.bashrc:
#   source /path/to/gpu-pivot/scripts/completion.bash
# It finds the tasks beside itself, so it completes from any directory.
# Invoke's --complete expects the line to start with the word `invoke`: the first word is
# replaced by it, so `.venv/bin/invoke teardown -<TAB>` (invoke typed by path) completes too.
_gpu_pivot_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

_gpu_pivot_complete() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" candidates
    # `--host=gp<TAB>`: bash splits at '=', so the flag is two words back
    if [ "$prev" = "=" ] && [ "$COMP_CWORD" -ge 2 ]; then
        prev="${COMP_WORDS[COMP_CWORD-2]}"
    fi
    [ "$cur" = "=" ] && cur=""
    case "$prev" in
        --host|-H)
            candidates="$("${COMP_WORDS[0]}" --search-root "$_gpu_pivot_root" hosts --names 2>/dev/null)" ;;
        *)
            candidates="$("${COMP_WORDS[0]}" --search-root "$_gpu_pivot_root" --complete -- "invoke ${COMP_WORDS[*]:1}" 2>/dev/null)" ;;
    esac
    # shellcheck disable=SC2207  # one word per candidate: aliases, tasks and flags have no spaces
    COMPREPLY=($(compgen -W "$candidates" -- "$cur"))
}

complete -F _gpu_pivot_complete -o default invoke inv
