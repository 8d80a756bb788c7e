"""What runs a notebook beside student code, inside the sandbox: the zygote, its children, the kernel."""
