//! `pvisor completions bash|zsh|fish|...`: the shell completion script of
//! the whole CLI (clap_complete), printed on stdout.
use clap::CommandFactory;
use clap_complete::Shell;

pub fn print<C: CommandFactory>(shell: Shell) {
    let mut cmd = C::command();
    let name = cmd.get_name().to_string();
    clap_complete::generate(shell, &mut cmd, name, &mut std::io::stdout());
}
