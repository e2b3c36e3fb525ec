from kvops.cli import main

main()
