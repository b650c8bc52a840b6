// sdalloc - the command-line program (placeholder while `replay` is written).
int main() { return 0; }
