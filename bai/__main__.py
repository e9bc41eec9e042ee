from bai.cli.main import main

main()
