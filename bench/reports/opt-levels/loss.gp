# written by mixprec; re-plot with: cd 'bench/reports/opt-levels' && gnuplot 'loss.gp'
set terminal pngcairo size 1000,620 noenhanced
set output 'loss.png'
set title 'training loss'
set xlabel 'step'
set ylabel 'loss'
set grid
set datafile missing '?'
set key top right
plot 'loss.dat' index 0 using 1:2 with lines lw 2 title 'fp32', \
     'loss.dat' index 1 using 1:2 with lines lw 2 title 'bf16 O1', \
     'loss.dat' index 2 using 1:2 with lines lw 2 title 'bf16 O2', \
     'loss.dat' index 3 using 1:2 with lines lw 2 title 'bf16 O3', \
     'loss.dat' index 4 using 1:2 with lines lw 2 title 'fp16 O1', \
     'loss.dat' index 5 using 1:2 with lines lw 2 title 'fp16 O2', \
     'loss.dat' index 6 using 1:2 with lines lw 2 title 'fp16 O3'
