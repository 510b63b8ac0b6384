from pgplane.cli.main import main

main()
